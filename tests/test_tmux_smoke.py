"""Drive the real `dflash chat` in a real terminal (tmux): type a prompt in one burst with ctrl+u in it, wait
for the answer, read the screen, hand a message to $EDITOR (ctrl+x ctrl+e) and send it, toggle thinking,
quit, find the session file."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import tiny, waiting

ROOT = Path(__file__).resolve().parents[1]
TMUX = shutil.which("tmux")

pytestmark = pytest.mark.skipif(TMUX is None, reason="tmux is not installed (`.ci/run` installs it; "
                                                      "or apt-get install tmux)")


class Tmux:
    def __init__(self, socket: Path):
        self.socket = str(socket)

    def __call__(self, *args: str) -> str:
        return subprocess.run([TMUX, "-S", self.socket, *args], capture_output=True, text=True, check=True).stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "smoke")

    def wait_for(self, text: str) -> str:
        end = time.monotonic() + waiting.limit()
        screen = ""
        while time.monotonic() < end:
            screen = self.screen()
            if text in screen:
                return screen
            time.sleep(0.2)
        raise AssertionError(f"{text!r} never appeared; the screen was:\n{screen}")


def session_records(data: Path, count: int) -> list[dict]:
    """The one session file's records, once it holds `count` of them."""
    end = time.monotonic() + waiting.limit()
    while time.monotonic() < end:
        files = list((data / "sessions").glob("*.jsonl"))
        lines = files[0].read_text().splitlines() if len(files) == 1 else []
        if len(lines) >= count:
            return [json.loads(x) for x in lines]
        time.sleep(0.2)
    raise AssertionError(f"the session never held {count} records")


def test_dflash_chat_in_tmux(pairs, tmp_path):
    target, draft = pairs("qwen3")
    profile = tiny.write_profile(tmp_path / "tiny.toml", target, draft, max_new_tokens=32)
    data = tmp_path / "data"
    # COLUMNS/LINES as a shell leaves them when tmux resizes a new pane: stale, and they must not win over
    # the terminal's real 120x40 (the wide layout below, with the stats panel and its legend, proves it)
    editor = tmp_path / "editor.sh"  # what it was given and the file's mode kept; a message of two lines saved
    editor.write_text(f'#!/bin/sh\nstat -c %a "$1" > {tmp_path}/mode\ncat "$1" > {tmp_path}/given\n'
                      'printf "from the editor\\nsecond line\\n" > "$1"\n')
    editor.chmod(0o700)
    env = {"DFLASH_DATA_DIR": str(data), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TERM": "xterm-256color",
           "PYTHONPATH": str(ROOT), "COLUMNS": "80", "LINES": "24", "VISUAL": "", "EDITOR": str(editor)}
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    command = (f"cd {shlex.quote(str(ROOT))} && env {exports} {shlex.quote(sys.executable)} -m dflash_tui chat "
               f"--profile {shlex.quote(str(profile))}; echo EXITED $?; sleep 60")
    tmux = Tmux(tmp_path / "tmux.sock")
    tmux("new-session", "-d", "-s", "smoke", "-x", "120", "-y", "40", command)
    try:
        screen = tmux.wait_for("cuda engine on")  # loaded: the header names engine and device
        assert "thinking ON" in screen
        tmux("send-keys", "-t", "smoke", "not this", "C-u", "hello from tmux", "Enter")  # one burst
        screen = tmux.wait_for("32 tokens ·")  # the answer footer: it is complete
        assert "you  hello from tmux" in screen
        assert "tok/s" in screen and "tau" in screen and "target" in screen  # stats (panel or folded line), legend
        tmux("send-keys", "-t", "smoke", "-l", "a draft")
        tmux("send-keys", "-t", "smoke", "C-x", "C-e")
        tmux.wait_for("second line")  # the app came back with what the editor saved, in the message box
        assert (tmp_path / "given").read_text() == "a draft" and (tmp_path / "mode").read_text().strip() == "600"
        tmux("send-keys", "-t", "smoke", "Enter")
        lines = session_records(data, 5)
        tmux("send-keys", "-t", "smoke", "C-t")
        tmux.wait_for("thinking OFF")
        tmux("send-keys", "-t", "smoke", "C-q")
        screen = tmux.wait_for("EXITED")
        assert "EXITED 0" in screen
        files = list((data / "sessions").glob("*.jsonl"))
        assert len(files) == 1 and files[0].stem in screen.replace("\n", "")
        # each prompt kept before its answer
        assert [line["type"] for line in lines] == ["header", "prompt", "turn", "prompt", "turn"]
        assert lines[2]["user"] == "hello from tmux" and lines[4]["user"] == "from the editor\nsecond line"
        assert lines[2]["status"] == "completed" and len(lines[2]["emitted_ids"]) == 32
    finally:
        subprocess.run([TMUX, "-S", tmux.socket, "kill-server"], capture_output=True)
        if os.path.exists(tmux.socket):
            os.unlink(tmux.socket)
