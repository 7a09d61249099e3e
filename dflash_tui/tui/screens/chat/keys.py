"""The chat's keys, and the palette's commands on answers.

Priority bindings: the message box (a TextArea) would otherwise take the function keys and ctrl+c. It keeps
readline's ctrl+a/e/k/u/w (widgets/prompt.py): the block size is on f7. The footer shows only what fits 80
columns with f1 and ^q still in view; the rest are in help (f1) and the palette (ctrl+p)."""

from __future__ import annotations

from textual.binding import Binding, BindingType
from textual.command import DiscoveryHit, Hit, Hits, Provider

from dflash_tui.tui.widgets import AnswerView

KEYS: list[BindingType] = [
    Binding("ctrl+t", "toggle_thinking", "thinking", priority=True),
    Binding("ctrl+g", "toggle_ghosts", "ghosts", show=False, priority=True),
    Binding("f7", "cycle_block", "block", priority=True),  # ctrl+k is readline's kill in the message box
    Binding("escape", "cancel", "stop", priority=True),
    Binding("ctrl+c", "interrupt", "stop", show=False, priority=True),
    # the conversation scrolls from the message box (whose own page keys would only move its cursor)
    Binding("pageup", "scroll_chat('page_up')", "scroll up", show=False, priority=True),
    Binding("pagedown", "scroll_chat('page_down')", "scroll down", show=False, priority=True),
    Binding("ctrl+home", "scroll_chat('home')", "top", show=False, priority=True),
    Binding("ctrl+end", "scroll_chat('end')", "bottom", show=False, priority=True),
    Binding("ctrl+n", "new_session", "new", priority=True),
    Binding("ctrl+l", "new_context", "new context", show=False, priority=True),
    Binding("ctrl+o", "sessions", "sessions", priority=True),
    Binding("ctrl+r", "replay", "replay", show=False, priority=True),
    Binding("f1", "app.help", "help", priority=True),
    Binding("f2", "markdown", "as written", show=False, priority=True),
    Binding("f3", "copy_answer", "copy", show=False, priority=True),
    Binding("f8", "copy_code", "copy code", show=False, priority=True),
    Binding("f9", "fold_thinking", "fold thinking", show=False, priority=True),
    Binding("alt+up", "mark(-1)", "earlier message", show=False, priority=True),
    Binding("alt+down", "mark(1)", "later message", show=False, priority=True),
    Binding("ctrl+f", "find", "find", show=False, priority=True),
    Binding("f4", "regenerate", "regenerate", show=False, priority=True),
    Binding("f5", "edit_last", "edit last", show=False, priority=True),
    Binding("f6", "continue_answer", "continue", show=False, priority=True),
    Binding("ctrl+q", "app.quit", "quit", priority=True),
]

# The palette's commands on answers: (title, help, ChatScreen action); "Answer as written" (f2) is the app's.
ANSWER_COMMANDS = [
    ("Copy message", "f3: copy the marked message (alt+up/down, ctrl+f), else the last answer", "copy_answer"),
    ("Copy thinking", "copy the thinking of the marked answer, else the last one's", "copy_thinking"),
    ("Fold thinking", "f9: fold or unfold the thinking of the marked answer, else the last one's", "fold_thinking"),
    ("Find in the conversation", "ctrl+f: mark the messages that hold a text, one by one", "find"),
    ("Regenerate answer", "f4: drop the last answer and ask the same prompt again", "regenerate"),
    ("Edit last prompt", "f5: drop the last answer and put its prompt back in the message box", "edit_last"),
    ("Continue answer", "f6: go on with a stopped (cancelled) last answer", "continue_answer"),
]


class AnswerCommands(Provider):
    """The answer commands in the command palette (ctrl+p)."""

    def _commands(self):
        chat = self.screen
        for title, help_text, action in ANSWER_COMMANDS:
            yield title, help_text, lambda a=action: chat.run_action(a)
        answers = chat.query(AnswerView)
        last = answers.last() if answers else None
        for n, (lang, _) in enumerate(last.code_blocks if last else []):  # the last answer's
            yield f"Copy code block {n + 1} ({lang})", "f8 copies each in turn", lambda n=n: chat.copy_code(last, n)

    async def discover(self) -> Hits:
        for title, help_text, callback in self._commands():
            yield DiscoveryHit(title, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, help_text, callback in self._commands():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), callback, help=help_text)
