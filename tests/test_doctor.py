"""`dflash --version`, `dflash doctor` and shell completion: facts for a bug report, names to complete."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from click.testing import CliRunner

from dflash_tui.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_version_names_the_frameworks_and_what_auto_picks():
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0, result.output
    lines = dict(line.split(None, 1) for line in result.output.splitlines())
    assert lines["dflash-tui"] == metadata.version("dflash-tui")
    assert lines["torch"] == metadata.version("torch") and lines["transformers"] == metadata.version("transformers")
    assert "mlx" in lines and "mlx-lm" in lines
    assert lines["auto-engine"].startswith(("cuda engine", "mlx engine"))


def test_doctor_checks_a_profiles_pair(tmp_path, pairs):
    from tests.tiny import write_profile

    target, draft = pairs("qwen3")
    profile = write_profile(tmp_path / "p.toml", target, draft)
    result = CliRunner().invoke(main, ["doctor", "--profile", str(profile)])
    assert result.exit_code == 0, result.output
    assert f"target           {target} (local folder" in result.output
    assert "memory" in result.output and ": fits" in result.output
    missing = CliRunner().invoke(main, ["doctor", "--profile", "qwen3-8b"], env={"HF_HUB_OFFLINE": "1"})
    assert missing.exit_code == 0 and "Qwen/Qwen3-8B (not downloaded)" in missing.output
    assert "cannot tell" in missing.output


def test_shell_completion_offers_profile_names_and_session_ids(data_dir):
    from dflash_tui.core import sessions

    writer = sessions.SessionWriter({"profile": {"name": "x"}}, session_id="20260101-120000-comp")
    writer.append_turn({"index": 0, "status": "completed", "user": "q", "answer": "a", "settings": {}})
    writer.close()
    env = {**os.environ, "DFLASH_DATA_DIR": str(data_dir), "_DFLASH_COMPLETE": "bash_complete"}

    def complete(words: str) -> list[str]:
        out = subprocess.run([sys.executable, "-m", "dflash_tui"], env={**env, "COMP_WORDS": words,
                             "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1))},
                             capture_output=True, text=True, cwd=ROOT, timeout=120).stdout
        return [line.split(",", 1)[1] for line in out.splitlines()]

    assert "qwen3.5-27b" in complete("dflash generate --profile qwen3.5")
    assert complete("dflash sessions show 2026") == ["20260101-120000-comp"]
