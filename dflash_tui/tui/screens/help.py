"""F1: every key, what the figures and the colours mean. It scrolls (keys and mouse wheel), so an
80x24 terminal reaches every row."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from dflash_tui.engines.config import EFFORTS
from dflash_tui.tui.contrast import origin_styles, theme_background

KEY_HELP = [
    ("enter", "send the message"),
    ("ctrl+j / shift+enter", "new line in the message"),
    ("↑ / ↓", "earlier prompts (on the first / last line)"),
    ("ctrl+t", "thinking on/off for the next turns; gpt-oss has no off: it cycles its reasoning effort "
               f"({', '.join(EFFORTS)}), shown as effort in the header"),
    ("ctrl+g", "show rejected draft tokens (ghosts): in the marked answer, else in every answer"),
    ("ctrl+a / ctrl+e", "start / end of the message's line (readline)"),
    ("ctrl+k / ctrl+u", "delete to the end / start of the line (readline; ctrl+w a word)"),
    ("f7", "next block size (1, 2, 4, 8, 16, the profile's)"),
    ("escape", "stop the answer (it stays, marked cancelled); back to the message box"),
    ("ctrl+c", "stop the answer; with nothing running, copy the selection, else clear the whole message "
               "(ctrl+z brings it back), or with the box empty say how to quit"),
    ("ctrl+x ctrl+e", "edit the message in $VISUAL or $EDITOR, as shells do (ctrl+x alone cuts a selection)"),
    ("pageup / pagedown", "scroll the conversation, from the message box too"),
    ("ctrl+home / ctrl+end", "the conversation's top / end"),
    ("tab", "message box ⇄ conversation; typing in the conversation goes to the message box"),
    ("ctrl+n", "new session"),
    ("ctrl+l", "new context: clear the kept caches (the history stays)"),
    ("ctrl+o", "sessions, last used first: resume, search (/; each match shows where, ↓ goes to the list), "
               "rename (r), delete, export"),
    ("ctrl+r", "replay the session across block sizes"),
    ("f2 / click", "the marked, clicked or last answer as written / rendered as Markdown again"),
    ("f3", "copy the marked message, else the last answer"),
    ("f8", "copy a code block of the marked or last answer, the next one each press (or click its title)"),
    ("f9", "fold / unfold the thinking of the marked or last answer"),
    ("alt+up / alt+down", "mark an earlier / later message (f3 copies it, f2 shows it as written; escape unmarks)"),
    ("ctrl+f", "find in the conversation: highlights the text, marks each message holding it (enter or ↑ earlier, ↓ later)"),
    ("f4", "regenerate the last answer"),
    ("f5", "edit and resend the last prompt"),
    ("f6", "continue a stopped answer"),
    ("shift+tab", "reach the example prompts on the first screen"),
    ("ctrl+p", "command palette: profile, draft, engine, temperature, theme, system prompt, …; type a setting and "
               "enter: temperature 0.7, top_p 0.9, top_k 20, min_p 0.05, max_new_tokens 512, seed 7, block 3, draft NAME"),
    ("f1", "this help"),
    ("ctrl+q", "quit (a running answer is stopped and saved first)"),
]

FIGURES = [
    ("tok/s", "generated tokens per second of decoding (prefill not counted)"),
    ("speedup", "≈ measured: this turn's tokens per step over its median step time (draft, verify and the engine's "
                "work between them), against block "
                "1's median step, a plain target step timed on the same engine at about the same context (both inside "
                "the engine, as a replay compares them); ± the figure's spread over the middle half of this turn's "
                "steps, \"noisy\" when the steps' times scatter (a busy machine); the session's figure beside it "
                "(in brackets on the one-line stats); \"–\" until measured, or once the context grew 25% past it"),
    ("tau", "mean tokens each verify pass commits (the session's in brackets; \"mixed\" when its turns ran at "
            "more than one block size, which its tau averages over)"),
    ("block", "block size: each step the draft proposes a block and the target verifies it; 1 is the target alone"),
    ("DFlash N", "which draft runs, as its config says: DFlash 1, or DFlash 2 (a candidate selector walks one "
                 "path through each block; at temperature > 0 its drafts are kept by rejection sampling); ctrl+p, "
                 "Draft: switches between the drafts a profile lists"),
    ("temp", "temperature from the next turn (ctrl+p: pick one, or type any, as temperature 0.7); 0 is greedy"),
    ("top_p", "shown once set: ctrl+p, type top_p 0.9 (from the next turn; top_k, min_p, seed and max_new_tokens "
              "likewise, recorded with each turn)"),
    ("ctx", "tokens in the context: prompt and answer, of the target's limit"),
    ("draft N%", "the share of the decode steps' time spent drafting (the rest verifies with the target)"),
    ("peak", "peak memory of the last turn (peak RSS: the process's, on the CPU)"),
    ("reused", "prompt tokens taken from the caches the last turn left (the rest are prefilled)"),
]


def _table(rows: list[tuple[str, str]]) -> Table:
    table = Table(box=None, show_header=False, padding=(0, 2, 0, 0), expand=True)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(ratio=1)
    for key, what in rows:
        table.add_row(key, what)
    return table


def legend(styles: dict) -> Text:
    """What the answer's colours mean, in the colours the answer uses on this theme."""
    text = Text()
    text.append("Colours: ")
    text.append("accepted draft tokens", style=styles["draft"])
    text.append(" (bold) came free from the draft; ")
    text.append("target tokens", style=styles["target"])
    text.append(" are the target's own (one per verify step, or where it disagreed); ")
    text.append("ghosts", style=styles["ghost"])
    text.append(" (italic, underlined) are draft proposals the target rejected (ctrl+g shows them). "
                "The side panel names them too, or the header's right end where the panel is folded away.")
    return text


class HelpScreen(ModalScreen):
    BINDINGS = [Binding("escape,f1,q", "dismiss", "close")]

    def compose(self) -> ComposeResult:
        with Vertical(id="help-box"):
            yield Static("dflash · keys", classes="modal-title")
            with VerticalScroll(id="help-scroll"):
                yield Static(_table(KEY_HELP))
                yield Static("The figures", classes="help-heading")
                yield Static(_table(FIGURES))
                yield Static(legend(origin_styles(theme_background(self.app.current_theme))), id="help-legend")
            yield Static("↑ ↓ pgup pgdn scroll · escape closes", classes="modal-hint")

    def on_mount(self) -> None:
        self.query_one("#help-scroll").focus()  # the arrow and page keys scroll it
