"""Sending a message and streaming its answer, and the settings a turn runs with (thinking, ghosts, block).

Each answer decodes in a thread worker that only appends events to a queue; a timer on the UI thread drains
the queue every `DflashApp.FLUSH_INTERVAL` seconds and renders them in one go, so rendering cost does not grow
with the engine's token rate. The worker reports the end of the turn with a `TurnFinished` message; once the
chat is idle, another worker times a block-1 step (`Conversation.measure_block1`) so the speedup shown is
measured. Nothing here blocks the UI thread: keys typed at any moment reach the message box."""

from __future__ import annotations

from typing import Optional

from textual import work
from textual.message import Message

from dflash_tui.core.conversation import ActiveTurn, Conversation
from dflash_tui.core.figures import fixed, known
from dflash_tui.engines.errors import UserError
from dflash_tui.engines.events import Summary
from dflash_tui.tui.screens.chat.base import ChatBase
from dflash_tui.tui.widgets import AnswerView, PromptInput, UserMessage
from dflash_tui.tui.widgets.answer import Welcome, recorded_think_tokens


class TurnFinished(Message, bubble=False):
    """The generate worker is done with a turn (completed, cancelled or failed with `error`)."""

    def __init__(self, active: ActiveTurn, error: Optional[str]) -> None:
        super().__init__()
        self.active = active
        self.error = error


class BlockOneMeasured(Message, bubble=False):
    """The measure worker timed a block-1 step: the speedup can now be shown as measured."""


class TurnActions(ChatBase):
    """Sending, streaming and finishing turns, and the knobs the next turn runs with."""

    def on_prompt_input_submitted(self, message: PromptInput.Submitted) -> None:
        text = message.text.strip("\n")
        if self.conversation is None:
            self._prompt.load_text(text)
            self.notify("The model is still loading." if self.app.loading else
                        "No model is loaded; ctrl+p switches profile or engine.", severity="warning")
            return
        if self.active is not None:
            self._prompt.load_text(text)
            self.notify("Still answering; escape stops it.", severity="warning")
            return
        if not self.send(text) and not self._prompt.text:
            self.fill_prompt(message.text)  # refused (too long for the context): the text stays to be shortened

    def send(self, text: str) -> bool:
        """Start a turn on `text`; False when it was refused (the person is told why)."""
        conversation = self.conversation
        assert conversation is not None  # sent only once a model is loaded, or again after one answered
        try:
            active = conversation.begin(text)
        except UserError as exc:
            self.notify(str(exc), severity="error", timeout=8)
            return False
        answer = AnswerView(thinking=active.request.thinking, ghosts=self.ghosts, fmt=conversation.format)
        self._start(conversation, active, answer, UserMessage(text))
        return True

    def _start(self, conversation: Conversation, active: ActiveTurn, answer: AnswerView, *before) -> None:
        view = self._view
        for welcome in self.query(Welcome):
            welcome.remove()
        view.mount(*before, answer)
        view.follow()  # the person sent it: to the end, following the answer until they scroll up
        self.active, self.active_view = active, answer
        self.refresh_chrome()
        self._generate(conversation, active)

    @work(thread=True, group="generate")
    def _generate(self, conversation: Conversation, active: ActiveTurn) -> None:
        error = None
        push = self._events.append
        try:
            for event in conversation.stream(active):
                push(event)
        except UserError as exc:
            error = str(exc)
        except Exception as exc:  # noqa: BLE001 - shown on screen
            error = f"{type(exc).__name__}: {exc}"
        try:
            self.post_message(TurnFinished(active, error))  # False once the app is gone: the turn is recorded
        except RuntimeError:  # the event loop already closed
            pass

    def _flush_events(self) -> None:
        if not self._events or self.active_view is None:
            return
        events = []
        pop = self._events.popleft
        while self._events:
            events.append(pop())
        self.flushes += 1
        view = self.active_view
        view.add_events(events)
        grew = view.render_text(cheap=True)
        self._show_stats(self._stats_data())
        # the conversation follows new text itself, and never moves a reader who scrolled up: they are told
        if grew and not self._view.following:
            self.query_one("#new-text").display = True

    def on_turn_finished(self, message: TurnFinished) -> None:
        active, error = message.active, message.error
        self._flush_events()
        view = self.active_view
        turn = active.turn
        status = turn.status if turn else ("error" if error else "cancelled")
        summary = turn.summary if turn else None
        if view is not None:
            engine = self.app.engine
            # exact, as a resume counts it
            if view.thinking and turn is not None and turn.continues is None and engine is not None:
                view.think_tokens = recorded_think_tokens(engine.decode, turn.emitted_ids, view.fmt)
            view.finish(status, footer_for(summary, turn.save_error if turn else None))
        self.active, self.active_view = None, None
        self.turns_done += 1
        self.finished.append(active)
        if error:
            self.notify(error, severity="error", timeout=10)
        self.refresh_chrome()
        if not error and self.conversation is not None:
            # once the finished answer is drawn: the UI's repaint on the other core slowed the probe's few steps
            # (and so raised the figure) when they ran while it drew
            self.call_after_refresh(self._measure, self.conversation)

    @work(thread=True, group="measure", exclusive=True)
    def _measure(self, conversation: Conversation) -> None:
        """Time block 1 off the UI thread; a turn begun meanwhile waits only for its few forwards."""
        if conversation.measure_block1():
            try:
                self.post_message(BlockOneMeasured())
            except RuntimeError:  # the event loop already closed
                pass

    def on_block_one_measured(self, message: BlockOneMeasured) -> None:
        self.measures += 1
        if self.active is None:
            self.refresh_chrome()

    # -- what the next turn runs with ---------------------------------------------------------------
    def action_toggle_thinking(self) -> None:
        if self.conversation is None:
            self.app.flags.thinking = not self.thinking_before_load()
        else:
            warning = self.conversation.toggle_thinking()
            if warning:
                self.notify(warning, severity="warning", timeout=8)
        self.refresh_chrome()

    def action_toggle_ghosts(self) -> None:
        """ctrl+g: show or hide the rejected proposals of the marked answer (alt+up/down, ctrl+f), so one answer
        can be studied while the rest read plainly; with none marked, of every answer and the next ones."""
        marked = self.marked_answer()
        if marked is not None:
            marked.set_ghosts(not marked.ghosts)
            shown = "shown" if marked.ghosts else "hidden"
            self.toast("ghosts", f"Ghosts {shown} in the marked answer; escape unmarks it, then ctrl+g sets all.")
            return
        self.ghosts = not self.ghosts
        for view in self.query(AnswerView):  # the conversation keeps the reader's line as the heights change
            view.set_ghosts(self.ghosts)
        self.refresh_chrome()

    def action_cycle_block(self) -> None:
        if self.conversation is None:
            return
        try:
            block = self.conversation.cycle_block()
        except UserError as exc:  # a server that runs its own block size
            self.toast("block", str(exc), timeout=6)
            return
        self._block_chosen(self.conversation, block)

    def set_block(self, block: int) -> None:
        """Block size `block` from the next turn (the palette's), or the sentence saying why not."""
        if self.conversation is None:
            return
        try:
            warnings = self.conversation.set_block(block)
        except UserError as exc:
            self.notify(str(exc), severity="error", timeout=8)
            return
        for warning in warnings:  # above the draft's trained size: it runs, and the person knows what to expect
            self.notify(warning, severity="warning", timeout=8)
        self._block_chosen(self.conversation, block)

    def _block_chosen(self, conversation: Conversation, block: int) -> None:
        self.toast("block", f"Block size {block} from the next turn.")
        self.refresh_chrome()
        self._prepare(conversation)

    @work(thread=True, group="prepare", exclusive=True)
    def _prepare(self, conversation: Conversation) -> None:
        """Capture what the new block size needs while idle (CUDA graphs on a GPU), so the next send does
        not wait for it; a toast says so when it happened."""
        block = conversation.settings.block_size
        if conversation.prepare_steps():
            self.app.call_from_thread(self.toast, "block", f"Block {block} is ready (CUDA graphs captured).")


def footer_for(summary: Optional[Summary], save_error: Optional[str] = None) -> Optional[str]:
    """The line under an answer: its figures, why it stopped early, and whether the file has it."""
    if summary is None:
        return save_error
    parts = [f"{summary.generated_tokens} tokens", f"{summary.decode_tokens_per_s:.1f} tok/s",
             f"tau {fixed(summary.mean_acceptance_length)}", f"block {known(summary.block_size)}"]
    stopped = "" if summary.finish_reason == "cancelled" else summary.stopped_by  # "⏹ cancelled" says so already
    parts += [note for note in (stopped, save_error) if note]
    return " · ".join(parts)
