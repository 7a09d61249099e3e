"""Acting on the conversation's messages: marking and finding them, copying them (OSC 52; a code block or the
thinking on its own too), showing an answer as written (f2; answers stream as Markdown), folding its thinking,
and redoing the last turn (regenerate, edit its prompt, continue a stopped answer)."""

from __future__ import annotations

from typing import Optional

from textual.binding import Binding

from dflash_tui.engines.errors import UserError
from dflash_tui.tui.screens.chat.base import CONTINUING
from dflash_tui.tui.screens.chat.turns import TurnActions
from dflash_tui.tui.widgets import AnswerView, NoticeLine, UserMessage
from dflash_tui.tui.widgets.keys import TextInput


class AnswerActions(TurnActions):
    """Marking, finding, copying and redoing messages."""

    def action_mark(self, by: int) -> None:
        """alt+up / alt+down: mark the message before or after the marked one (from the end at first)."""
        found = self.messages()
        if not found:
            return
        at = found.index(self.marked) if self.marked in found else len(found)
        self.mark(found[max(0, min(at + by, len(found) - 1))])

    def action_find(self) -> None:
        find = self.query_one("#find", FindInput)
        find.add_class("-open")
        self.set_focus(find)  # at once, not after the keys already queued: those behind ctrl+f are the search

    def on_input_changed(self, event) -> None:
        if event.input.id == "find":
            self.highlight(event.value)
            self.find_step(0)

    def highlight(self, query: str) -> None:
        """Show where `query` stands in every message (any case; "" clears): marking a whole message
        says which one, this says where in it."""
        for widget in self.messages():
            widget.highlight(query or None)

    def find_step(self, by: int) -> None:
        """Mark a message holding the find bar's text (any case): the last one at first (by 0), then each
        earlier one (by -1) or later one (by 1), round the conversation."""
        find = self.query_one("#find", FindInput)
        needle = find.value.lower()
        found = [w for w in self.messages() if needle and needle in message_text(w).lower()]
        if not found:
            self.mark(None)
            if needle:
                self.toast("find", f"Nothing holds {find.value!r}.")
            return
        if by == 0 or self.marked not in found:
            target = found[-1]
        else:
            target = found[(found.index(self.marked) + by) % len(found)]
        self.mark(target)
        self.toast("find", f"{found.index(target) + 1} of {len(found)} messages hold {find.value!r}.")

    def last_answer(self) -> Optional[AnswerView]:
        """The last finished answer on screen (None when there is none, told to the person)."""
        done = [v for v in self.query(AnswerView) if v.status != "streaming"]
        if not done:
            self.notify("There is no finished answer yet.", severity="warning", timeout=3)
        return done[-1] if done else None

    async def action_markdown(self) -> None:
        """Toggle the marked or clicked answer (else the last) between coloured tokens and rendered Markdown."""
        view = self.marked_answer() or (self.selected if self.selected is not None and self.selected.is_attached else
                                        self.last_answer())
        if view is not None:
            await view.show_markdown(not view.markdown)

    async def on_answer_view_selected(self, message: AnswerView.Selected) -> None:
        self.selected = message.answer
        await message.answer.show_markdown(not message.answer.markdown)

    def action_copy_answer(self) -> None:
        """f3: copy the marked message (alt+up/down, ctrl+f), else the last answer."""
        marked = self.marked_message()
        if isinstance(marked, UserMessage):
            self.copy(marked.text, f"Copied your message ({len(marked.text)} characters).")
            return
        view = marked or self.last_answer()
        if view is not None:
            self.copy(view.answer_text, f"Copied the answer ({len(view.answer_text)} characters).")

    def copy(self, text: str, said: str) -> None:
        """`text` to the clipboard, and a toast that says what was copied."""
        self.app.copy_to_clipboard(text)
        self.toast("copy", said)

    def answer_in_reach(self) -> Optional[AnswerView]:
        """The marked answer, else the last one on screen, finished or not (None when there is none, told)."""
        marked = self.marked_answer()
        if marked is not None:
            return marked
        answers = self.query(AnswerView)
        if not answers:
            self.toast("answer", "There is no answer yet.")
        return answers.last() if answers else None

    def action_copy_code(self) -> None:
        """f8: copy a code block of the marked or last answer; each press the next one."""
        view = self.answer_in_reach()
        if view is not None:
            self.copy_code(view)

    def copy_code(self, view: AnswerView, index: Optional[int] = None) -> None:
        picked = view.pick_code(index)
        if picked is None:
            self.toast("copy", "That answer has no code block.")
        else:
            self.copy(picked.code, picked.said)

    def on_answer_view_copy_code(self, message: AnswerView.CopyCode) -> None:
        self.copy_code(message.answer, message.index)

    def action_copy_thinking(self) -> None:
        view = self.answer_in_reach()
        thought = view.thinking_text.strip() if view is not None else ""
        if thought:
            self.copy(thought, f"Copied the thinking ({len(thought)} characters).")
        elif view is not None:
            self.toast("copy", "That answer has no thinking.")

    def action_fold_thinking(self) -> None:
        """f9: fold or unfold the thinking of the marked or last answer."""
        view = self.answer_in_reach()
        if view is not None and not view.fold_thinking():
            self.toast("answer", "That answer has no thinking.")

    def _take_back_last(self):
        """Retract the last turn from the chat (and so from the session) and the screen: regenerate and
        edit ask again in its place. Returns that turn, or None (told why)."""
        conv = self.conversation
        if conv is None or self.busy():
            return None
        try:
            turn = conv.retract_last()
        except UserError as exc:
            self.notify(str(exc), severity="warning", timeout=3)
            return None
        answers = self.query(AnswerView)
        if answers:
            answer = answers.last()
            # the line right above it goes too: its question, or for a continuation the "continuing" line
            heading = UserMessage if turn.continues is None else NoticeLine
            shown = list(self._view.children)
            place = shown.index(answer)
            above = shown[place - 1:place] if place and isinstance(shown[place - 1], heading) else []
            for widget in (*above, answer):
                widget.remove()
        return turn

    def action_regenerate(self) -> None:
        turn = self._take_back_last()
        if turn is not None:
            self.send(turn.user)

    def action_edit_last(self) -> None:
        turn = self._take_back_last()
        if turn is not None:
            self.fill_prompt(turn.user)

    def action_continue_answer(self) -> None:
        """Go on with a stopped last answer: a new turn that starts with what it said so far."""
        conv = self.conversation
        if conv is None or self.busy():
            return
        try:
            active = conv.continue_turn()
        except UserError as exc:
            self.notify(str(exc), severity="warning", timeout=6)
            return
        answer = AnswerView(thinking=active.request.thinking, ghosts=self.ghosts, fmt=conv.format)
        stopped = self.query(AnswerView)
        if stopped:
            answer.segments, answer.raw = list(stopped.last().segments), stopped.last().raw
        self._start(conv, active, answer, NoticeLine(CONTINUING))


def message_text(widget) -> str:
    """What a message says: the person's text, or an answer's whole text (its thinking too)."""
    return widget.text if isinstance(widget, UserMessage) else widget.raw


class FindInput(TextInput):
    """The find bar (ctrl+f): enter or up marks the message before, down the one after."""

    BINDINGS = [Binding("up", "step(-1)", show=False), Binding("down", "step(1)", show=False)]
    screen: AnswerActions

    def action_step(self, by: int) -> None:
        self.screen.find_step(by)

    async def action_submit(self) -> None:
        self.screen.find_step(-1)
