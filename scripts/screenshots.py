"""The README's screenshots: the chat on the demo pair as a person sees it, saved as SVG by Textual itself.

`make screenshots` runs it after a change to what the TUI shows. It drives the real app headless (no terminal
needed): a first answer at 100x30, the same chat at 80x24, and help (f1). The session it records goes to a
temporary data folder, never yours.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "What is 48 + 75?"


async def until(pilot, ready, what: str, timeout_s: float = 120) -> None:
    """Wait for `ready()`, in the app's own loop; a screenshot of a half-drawn screen would be worse than none."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not ready():
        if loop.time() > deadline:
            raise SystemExit(f"screenshots: gave up waiting for {what}")
        await pilot.pause(0.05)


async def shoot(out: Path) -> list[Path]:
    from dflash_tui.tui.app import DflashApp

    app = DflashApp(profile="demo", engine="cuda", animate=False)  # its engine in a child process, as dflash chat runs it
    saved = []
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.conversation is not None or app.load_error is not None, "the demo to load")
        if app.load_error:
            raise SystemExit(f"screenshots: the demo did not load: {app.load_error}")
        app.conversation.settings.temperature = 0.0
        await pilot.press(*PROMPT, "enter")
        await until(pilot, lambda: app.turns_done == 1, "the answer")
        await until(pilot, lambda: app.chat.measures >= 1, "the block-1 probe")
        app.chat.refresh_chrome()
        await pilot.pause()
        for name, size in (("chat.svg", (100, 30)), ("chat-80x24.svg", (80, 24))):
            await pilot.resize_terminal(*size)
            await pilot.pause()
            saved.append(Path(app.save_screenshot(name, str(out))))
        await pilot.press("f1")
        await pilot.pause()
        saved.append(Path(app.save_screenshot("help.svg", str(out))))
    return saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots", help="folder for the SVG files")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as data:
        os.environ["DFLASH_DATA_DIR"] = data  # the screenshot session is not the person's
        # the steady state: on a CPU the engine process compiles its steps in the background after the first
        # answer, and the block-1 probe timed beside that compile is rightly called noisy
        os.environ.setdefault("DFLASH_COMPILE", "0")
        for path in asyncio.run(shoot(args.out)):
            print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


if __name__ == "__main__":
    main()
