"""What the command line shows besides answers: no progress bar in a log, help that says what an option
prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from dflash_tui.cli import main

ROOT = Path(__file__).resolve().parents[1]

# A command run with stderr to a pipe, then transformers imported as an engine would: its tqdm bars
# ("Loading weights") are off, and the command line itself did not import transformers to say so.
QUIET = """
import sys
from dflash_tui.cli import main
main(["sessions", "list"], standalone_mode=False)
imported = "transformers" in sys.modules or "huggingface_hub" in sys.modules
from transformers.utils import logging
print("IMPORTED", imported, "BARS", logging.is_progress_bar_enabled())
"""


def test_no_progress_bar_is_written_to_a_stderr_that_is_no_terminal(data_dir):
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    env["DFLASH_DATA_DIR"] = str(data_dir)
    run = subprocess.run([sys.executable, "-c", QUIET], env=env, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1] == "IMPORTED False BARS False"
    # a setting of the user's own wins
    run = subprocess.run([sys.executable, "-c", QUIET], env={**env, "HF_HUB_DISABLE_PROGRESS_BARS": "0"},
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.stdout.splitlines()[-1] == "IMPORTED False BARS True"


def test_sessions_list_json_is_one_document_as_its_help_says(data_dir):
    from dflash_tui.core import sessions

    for n in range(2):
        writer = sessions.SessionWriter({"profile": {"name": "x"}}, session_id=f"20260101-12000{n}-json")
        writer.append_turn({"index": 0, "status": "completed", "user": f"q{n}", "answer": "a", "settings": {}})
        writer.close()
    listed = CliRunner().invoke(main, ["sessions", "list", "--json"], env={"DFLASH_DATA_DIR": str(data_dir)})
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.output)  # the whole output parses as one JSON value
    assert isinstance(rows, list) and sorted(r["id"] for r in rows) == ["20260101-120000-json", "20260101-120001-json"]
    help_text = " ".join(CliRunner().invoke(main, ["sessions", "list", "--help"]).output.split())
    assert "one JSON document: an array" in help_text and "per line" not in help_text
