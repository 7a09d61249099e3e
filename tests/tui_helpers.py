"""What the TUI tests share: starting the app on a loaded engine, waiting for it, sending a message, the
session file's records, and the WCAG contrast oracle. The fixtures (the tiny pair, its engines, its
profile) are in conftest.py."""

from __future__ import annotations

import json

from tests import waiting

SIZE = (120, 40)
SMALL = (80, 24)


def make_app(profile, engine=None, **kwargs):
    """The real app on `profile`; with `engine` it skips loading (None: the real load path, in a worker)."""
    from dflash_tui.tui.app import DflashApp

    return DflashApp(profile=str(profile), loaded_engine=engine, animate=False, **kwargs)


async def ready(pilot):
    """Until the app holds a conversation (or says why it could not load)."""
    app = pilot.app
    await waiting.until(pilot, lambda: app.conversation is not None or app.load_error is not None)
    await pilot.pause()


async def steady_cursor(pilot, selector: str = "#prompt"):
    """The message box's cursor drawn steady, as a snapshot shows it: it stops blinking, is drawn again
    from scratch, and the box has the focus. Stopping the blink alone left the screen to depend on the
    machine's speed: Textual's TextArea (8.2) caches its rendered lines under a key that leaves the focus
    out once `cursor_blink` is False, so a line cached in the blink's off phase (the app took over 0.5 s to
    get here, as on a loaded machine) kept the cursor hidden, and the snapshot differed. Dropping that cache
    (the documented hook for cached render data, `notify_style_update`) draws what the focus says."""
    box = pilot.app.screen.query_one(selector)
    await waiting.until(pilot, lambda: box.has_focus)
    box.cursor_blink = False
    box.notify_style_update()
    box.refresh()
    await pilot.pause()


def burst(app, *keys: str) -> None:
    """Keys queued at once, as a terminal delivers a fast burst (the pilot's press lets the app settle
    between keys, which hid the defects: a binding ran after the text typed behind it)."""
    from textual import events
    from textual.keys import _character_to_key

    for key in keys:  # a character stands for its key ("/" is slash), as the pilot's press reads it
        app.post_message(events.Key(_character_to_key(key), key) if len(key) == 1 else events.Key(key, None))


async def open_sessions(pilot):
    """ctrl+o, then the session picker once it is the screen."""
    from dflash_tui.tui.screens import SessionsScreen
    from tests import waiting

    await pilot.press("ctrl+o")
    await waiting.until(pilot, lambda: isinstance(pilot.app.screen, SessionsScreen))
    return pilot.app.screen


async def send(pilot, text):
    """Type `text`, press enter, wait for the turn to end; returns its `ActiveTurn`."""
    app = pilot.app
    before = app.turns_done
    await pilot.press(*text, "enter")
    await waiting.until(pilot, lambda: app.turns_done > before)
    await pilot.pause()
    return app.finished[-1]


def session_lines(app) -> list[dict]:
    """Every record of the chat's session file, header first, but the prompt records (each written before its
    answer starts, then settled by its turn record: test_prompt_kept.py reads those)."""
    path = app.conversation.writer.path
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["type"] != "prompt"]


def wcag(a, b) -> float:
    """WCAG 2 contrast ratio of two (r, g, b) colours, written out here as the oracle."""
    def lum(rgb):
        c = [v / 255 for v in rgb]
        c = [v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4 for v in c]
        return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2]

    hi, lo = sorted((lum(a), lum(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def in_256_colours(rgb) -> tuple:
    """An (r, g, b) colour as a 256-colour terminal (tmux's default) shows it."""
    from rich.color import Color, ColorSystem

    c = Color.from_rgb(*rgb).downgrade(ColorSystem.EIGHT_BIT).get_truecolor()
    return (c.red, c.green, c.blue)


def _is_text(ch: str) -> bool:
    """A character read as text: not a space, a box or block drawing (borders, scrollbars, bars) or braille."""
    import unicodedata

    code = ord(ch)
    if ch.isspace() or 0x2500 <= code <= 0x259F or 0x2800 <= code <= 0x28FF:
        return False
    return unicodedata.category(ch)[0] in "LNPS"


def unreadable_text(app) -> list[str]:
    """Every run of text on the screen as the terminal gets it (after Textual's own filters) that stays under
    3:1 against its background, in truecolor or in 256 colours: "text (ratio, how)". A modal screen is
    checked inside its box only (the screen behind it is meant to fade). Dim text counts as half-way to
    its background (Textual's own rendering of dim); text in the terminal's default colours is skipped."""
    from textual.command import CommandPalette
    from textual.screen import ModalScreen

    screen = app.screen
    if isinstance(screen, CommandPalette):
        region = screen.query_one("#--container").region
    elif isinstance(screen, ModalScreen):
        region = screen.children[0].region
    else:
        region = screen.region
    found = []
    for y, strip in enumerate(screen._compositor.render_strips()):
        x = 0
        for segment in strip:
            at, x = x, x + segment.cell_length
            style = segment.style
            if not region.contains(at, y) or style is None or not any(map(_is_text, segment.text)):
                continue
            fg, bg = (style.bgcolor, style.color) if style.reverse else (style.color, style.bgcolor)
            if fg is None or bg is None or fg.is_default or bg.is_default:
                continue
            f, b = fg.get_truecolor(), bg.get_truecolor()
            if style.dim:
                f = tuple(int(b[i] + (f[i] - b[i]) * 0.5) for i in range(3))
            for how, a, c in (("truecolor", tuple(f), tuple(b)), ("256 colours", in_256_colours(f), in_256_colours(b))):
                if wcag(a, c) < 3:
                    found.append(f"{segment.text.strip()!r} ({wcag(a, c):.2f}, {how})")
    return found


def recorded_turn(engine, user: str, answer: str, status: str = "completed", block: int = 4) -> dict:
    """A session record of `answer` as the engine's tokens, streamed at `block`: the first id the target's,
    then steps that each accept block - 2 drafted ids, reject one (a ghost) and add the target's own."""
    ids = engine.tokenizer.encode(answer, add_special_tokens=False)
    steps, at = [], 1
    while at < len(ids):
        accepted = min(block - 2, len(ids) - at - 1)
        steps.append({"drafted": ids[at:at + accepted] + [ids[0]], "accepted": accepted})
        at += accepted + 1
    return {"status": status, "user": user, "answer": answer, "prompt_ids": [], "emitted_ids": ids,
            "settings": {"block_size": block, "thinking": answer.startswith("<think>")}, "steps": steps,
            "summary": None}


def write_session(session_id: str, *turns: dict) -> str:
    """A recorded session of `turns` (see `recorded_turn`) in the data dir; returns its id."""
    from dflash_tui.core import sessions

    created = f"{session_id[:4]}-{session_id[4:6]}-{session_id[6:8]}T10:00:00+00:00"
    writer = sessions.SessionWriter({"created": created, "profile": {"name": "tiny"}, "engine": "cuda"},
                                    session_id=session_id)
    for index, turn in enumerate(turns):
        writer.append_turn({"index": index, **turn})
    writer.close()
    return session_id


def write_sessions(count: int) -> list[str]:
    """`count` one-turn session files; their ids in the order the picker lists them."""
    from dflash_tui.core import sessions

    for n in range(count):
        writer = sessions.SessionWriter({"created": f"2026-01-0{n + 1}T10:00:00+00:00", "profile": {"name": "tiny"},
                                         "engine": "cuda"}, session_id=f"2026010{n + 1}-100000-000{n}")
        writer.append_turn({"index": 0, "status": "completed", "user": f"question {n}", "answer": "…",
                            "settings": {}, "prompt_ids": [], "emitted_ids": [], "steps": [], "summary": None})
        writer.close()
    return [s.id for s in sessions.list_sessions()]


async def every_theme_reads(pilot, where: str) -> list[str]:
    """The text on the screen under 3:1 on each built-in theme (ANSI themes paint in the terminal's own
    colours, which are the terminal's to pick)."""
    app, failures = pilot.app, []
    for name in app.available_themes:
        if not name.startswith("ansi"):
            app.theme = name
            await pilot.pause()
            failures += [f"{where} on {name}: {text}" for text in unreadable_text(app)]
    return failures


async def press_at_once(pilot, *keys: str) -> None:
    """`burst`, then the app settles: every key is queued before the app handles the first."""
    burst(pilot.app, *keys)
    await pilot.pause()
