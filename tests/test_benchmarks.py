"""The benchmark scripts the README quotes still run end to end (one of them once broke when an action moved
from the app to the chat screen). Each runs briefly on the embedded demo pair or a random tiny model and
must print its table; no timing is asserted (speed belongs to the scripts' own output)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import waiting

ROOT = Path(__file__).resolve().parent.parent
BRIEF = {  # script -> (arguments for a short run, a line its table starts with)
    "engine_speed": (["--engines", "cuda", "--block-sizes", "1,16", "--max-new-tokens", "24", "--repeats", "1",
                      "--prompts", "{prompts}", "--json-schema", "benchmarks/answer.schema.json"],
                     "| block 16 + JSON schema |"),
    "draft_headroom": (["--drafts", "profiles/demo/draft,profiles/demo/draft2", "--prompts", "{prompts}",
                        "--max-new-tokens", "24"], "| draft | argmax | walk |"),
    "turn_cache": (["--turns", "2", "--repeats", "1", "--max-new-tokens", "24"], "| turn |"),
    "rollback_cost": (["--engines", "cuda", "--block-sizes", "4", "--repeats", "1"], "| block |"),
    "tui_overhead": (["--repeats", "1", "--max-new-tokens", "24"], "| prompt |"),
    "step_profile": (["--threads", "1", "--repeats", "1", "--eager", "--max-new-tokens", "24"], "| GEMM |"),
}


@pytest.mark.parametrize("script", sorted(BRIEF))
def test_benchmark_runs_and_prints_its_table(script, data_dir, tmp_path):
    arguments, table = BRIEF[script]
    prompts = tmp_path / "prompts.jsonl"  # a prompt set as `dflash bench` reads them (engine_speed --prompts)
    prompts.write_text('{"turns": ["What is 48 + 75?"]}\n{"turns": ["Sort: 5, 3, 9.", "And descending?"]}\n')
    arguments = [a.format(prompts=prompts) for a in arguments]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # the data folder is data_dir's (DFLASH_DATA_DIR)
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / f"{script}.py"), *arguments],
                            capture_output=True, text=True, cwd=ROOT, env=env, timeout=waiting.limit(600))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert table in result.stdout, result.stdout[-2000:]


def test_the_prepared_gpu_check_runs_its_plumbing_on_the_cpu(tmp_path, data_dir):
    """`make gpu-check` runs where no GPU is (its tests skip there): a quick CPU run writes both reports,
    with the K/V columns and the demo comparison, so the script is ready when a GPU machine is."""
    import json

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--out", str(tmp_path), "--quick"],
                            capture_output=True, text=True, cwd=ROOT, env=env, timeout=waiting.limit(600))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    assert report["demo"]["agree"] == len(report["demo"]["answers"]) == 2
    assert {"live_kv", "kv_read", "bucket"} <= set(report["speed"]["rows"][0])
    assert "| prompt | bucket | run | ms | live K/V | K/V read |" in (tmp_path / "gpu-check.md").read_text()
