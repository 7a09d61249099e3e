"""What the TUI tests share: starting the app on a loaded engine, waiting for it, sending a message, the
session file's records (the WCAG contrast oracle is in test_contrast.py). The fixtures (the tiny pair, its engines, its
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


async def press_at_once(pilot, *keys: str) -> None:
    """`burst`, then the app settles: every key is queued before the app handles the first."""
    burst(pilot.app, *keys)
    await pilot.pause()
