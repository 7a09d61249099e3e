"""The remote engine against a server nobody here wrote: mlx_lm.server (installed with the mlx extra) on the
demo target, on loopback. `generate`, `chat --plain`, `bench` and the TUI run through it; its /v1/models
crashes in this set-up (a known mlx_lm.server failure), which --model makes unnecessary, it takes
completion prompts as text only, which bench's prompt ids become, and it streams the thinking as
`reasoning` deltas with the model's own newlines around it, which the answer shows as a local engine's."""

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
    assert_local_layout(generated.stdout.rstrip("\n"))
    assert "tau –" in generated.stderr and "remote engine" in generated.stderr
    chatted = dflash("chat", "--plain", *remote, stdin="What is 48 + 75?\n", data_dir=data_dir)
    assert chatted.returncode == 0, chatted.stderr[-2000:]
    assert "123" in chatted.stdout and f"connecting to {mlx_server}" in chatted.stderr.lower()
    bench = dflash("bench", *remote, "--max-samples", "1", "--repeats", "1", "-B", "1", "--max-new-tokens", "8",
                   data_dir=data_dir)
    assert bench.returncode == 0, bench.stderr[-2000:]
    assert "fastest: block size 1" in bench.stdout
    # its progress in a pipe: one plain line per run (rich draws the bar on a terminal only)
    assert "\x1b" not in bench.stderr and "\r" not in bench.stderr
    assert any(line.startswith("1/") and "block 1" in line for line in bench.stderr.splitlines()), bench.stderr


def assert_local_layout(answer: str) -> None:
    """The demo's answer laid out as a local engine writes it: `<think>\\n` straight into the reasoning,
    `\\n</think>\\n\\n` straight into the answer, no blank line added by the server's deltas."""
    thinking, _, rest = answer.partition("\n</think>\n\n")
    assert thinking.startswith("<think>\nAdd 48 and 75") and rest == "48 + 75 = 123.", repr(answer)
    assert "\n\n" not in thinking, repr(answer)


@pytest.mark.asyncio
async def test_the_tui_chats_through_mlx_lm_server(mlx_server, data_dir):
    """`dflash chat --url … --model …`: the app connects (nothing loads here), answers, and shows the
    server's figures it cannot know as dashes."""
    pytest.importorskip("textual")
    from dflash_tui.core.settings import profile_for, with_remote
    from dflash_tui.tui.app import DflashApp
    from tests.tui_helpers import SIZE, ready, send

    app = DflashApp(profile=with_remote(profile_for("demo"), mlx_server, model=DEMO), engine="remote", animate=False)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert app.load_error is None and app.engine.name == "remote"
        assert app.loading_what == f"Connecting to {mlx_server} (model {DEMO})"
        turn = (await send(pilot, "What is 48 + 75?")).turn
        answer = app.query("AnswerView").last()
        shown = answer.answer_text, str(answer.query_one(".thinking-text").render())
        footer = str(answer.query_one(".answer-footer").render())
        header = str(app.screen.query_one("#header-state").render())
        app.engine.close()
    assert_local_layout(turn.answer)
    assert shown[0] == "48 + 75 = 123." and shown[1].startswith("Add 48 and 75"), shown
    assert "tau – · block –" in footer and "block –" in header, (footer, header)
