"""The chat screen, split by job: screen.py puts together base.py (state, header, stats, notices),
turns.py (sending and streaming), answers.py (find, copy, redo), history.py (sessions), keys.py (the
bindings and palette commands) and view.py (the scrolling conversation).

The app holds what outlives the screen (the engine, the profile, the `Conversation`) and loads engines;
what a chat *is* (history, settings, context trimming, requests, session records) lives in
`core.conversation`."""

from dflash_tui.tui.screens.chat.base import CONTINUING
from dflash_tui.tui.screens.chat.keys import KEYS
from dflash_tui.tui.screens.chat.screen import ChatScreen

__all__ = ["CONTINUING", "KEYS", "ChatScreen"]
