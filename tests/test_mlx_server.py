"""The remote engine against a server nobody here wrote: mlx_lm.server (installed with the mlx extra) on the
demo target, on loopback. `generate`, `chat --plain` and `bench` run through it; its /v1/models crashes in
this set-up (a known mlx_lm.server failure), which --model makes unnecessary, and it takes completion
prompts as text only, which bench's prompt ids become."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests import waiting

ROOT = Path(__file__).resolve().parents[1]
DEMO = str(ROOT / "profiles" / "demo" / "target")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlx_server():
    pytest.importorskip("mlx_lm")
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "mlx_lm", "server", "--model", DEMO, "--host", "127.0.0.1",
                               "--port", str(port)], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        for line in server.stderr:  # wait for the event, not for time
            if "Starting httpd" in line:
                break
        else:
            pytest.fail("mlx_lm.server exited before it served")
        # its request log keeps coming: drained, so a full pipe never blocks the server
        threading.Thread(target=server.stderr.read, daemon=True).start()
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.terminate()
        server.wait(timeout=waiting.limit(60))


def dflash(*args, stdin: str = "", data_dir) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DFLASH_DATA_DIR": str(data_dir)}
    return subprocess.run([sys.executable, "-m", "dflash_tui", *args], input=stdin, capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=waiting.limit(300))


def test_generate_chat_and_bench_through_mlx_lm_server(mlx_server, data_dir):
    remote = ["--url", mlx_server, "--model", DEMO]
    generated = dflash("generate", *remote, "What is 48 + 75?", data_dir=data_dir)
    assert generated.returncode == 0, generated.stderr[-2000:]
    assert "48 + 75 = 123." in generated.stdout
    assert "tau –" in generated.stderr and "remote engine" in generated.stderr
    chatted = dflash("chat", "--plain", *remote, stdin="What is 48 + 75?\n", data_dir=data_dir)
    assert chatted.returncode == 0, chatted.stderr[-2000:]
    assert "123" in chatted.stdout and f"connecting to {mlx_server}" in chatted.stderr.lower()
    bench = dflash("bench", *remote, "--max-samples", "1", "--repeats", "1", "-B", "1", "--max-new-tokens", "8",
                   data_dir=data_dir)
    assert bench.returncode == 0, bench.stderr[-2000:]
    assert "fastest: block size 1" in bench.stdout
