"""Replay: re-run a session's turns across block sizes, see the table and chart, then compare one turn's
text side by side per block size, coloured by origin (accepted draft tokens vs the target's own).

Each block size runs a warm-up and then `runs` passes (default 3); the table shows the best pass, the
spread between passes and their number, since one pass alone can be off by a factor (4.09x, then 18.59x
for the same session). Laid out for 80x24: the controls share one row, the identity column comes second,
and the wider columns to the right scroll with the table.

The work runs in a thread worker (`dflash_tui.measure.replay.run_replay`), reporting progress back with
`call_from_thread`; escape stops it between generations. The engine of the chat is reused when it runs
the session's target (and is idle); otherwise the session's own engine is loaded in the worker. The
comparison is saved next to the session, as `dflash replay` saves it, and the newest saved one is shown
when the screen opens.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Optional

from rich.console import Group
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, DataTable, Input, ProgressBar, Static

from dflash_tui.core import sessions
from dflash_tui.core.figures import fixed
from dflash_tui.core.settings import server_text
from dflash_tui.core.terminal import printable
from dflash_tui.measure import replay
from dflash_tui.measure.report import repeats_note
from dflash_tui.measure.runs import check_repeats
from dflash_tui.tui.contrast import origin_styles, theme_background
from dflash_tui.tui.widgets.keys import TextInput

if TYPE_CHECKING:
    from dflash_tui.engines.engine import EngineLike


class ReplayScreen(ModalScreen):
    BINDINGS = [
        Binding("escape,ctrl+r", "close", "close"),
        Binding("ctrl+enter,f5", "run", "run"),
    ]
    DEFAULT_CSS = """
    #replay-screen-box {
        width: 98%;
        height: 94%;
        border: round $primary;
        background: $surface;
        padding: 0 1;
    }
    #replay-controls { height: 3; }
    #replay-controls Static { width: auto; padding: 1 1 0 0; }
    #replay-controls Input { padding: 0 1; }
    #replay-session { width: 1fr; min-width: 12; }
    #replay-blocks { width: 15; }
    #replay-repeats { width: 6; }
    #replay-run { min-width: 7; }
    #replay-progress-row { height: 1; }
    #replay-progress { width: 20; }
    #replay-status { width: 1fr; padding: 0 0 0 1; }
    #replay-results { height: 1fr; }
    #replay-note { color: $text-muted; }
    #replay-table { height: auto; max-height: 12; }
    #replay-chart { height: auto; text-wrap: nowrap; }
    #replay-verdict { margin: 1 0 0 0; }
    #replay-turns { height: auto; max-height: 8; margin: 1 0 0 0; }
    #replay-compare { height: auto; }
    .replay-column { width: 1fr; height: auto; border: round $panel; padding: 0 1; }
    #replay-hint { color: $text-muted; height: 1; }
    """

    def __init__(self, session_id: Optional[str] = None) -> None:
        super().__init__()
        self.session_id = session_id
        self.comparison: Optional[replay.ReplayResult] = None
        self.cancel = threading.Event()
        self.running = False
        self._own_engine: Optional[EngineLike] = None  # an engine this screen loaded (the chat's runs another target)

    # -- layout ----------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        with Vertical(id="replay-screen-box"):
            yield Static("replay · re-run every turn of a session at several block sizes", classes="modal-title")
            with Horizontal(id="replay-controls"):
                yield Static("session")
                yield TextInput(self.session_id or self._newest() or "", placeholder="session id", id="replay-session")
                yield Static("blocks")
                yield TextInput(",".join(str(b) for b in replay.DEFAULT_BLOCK_SIZES), id="replay-blocks",
                            placeholder="1,2,4,8,16", select_on_focus=False)  # a selection is 2:1 on some themes
                yield Static("runs")
                yield TextInput(str(replay.DEFAULT_REPEATS), id="replay-repeats", type="integer")
                yield Button("run", id="replay-run", variant="primary")
            with Horizontal(id="replay-progress-row"):
                yield ProgressBar(id="replay-progress", show_eta=False)
                yield Static("enter runs the replay", id="replay-status")
            with VerticalScroll(id="replay-results"):
                yield Static("", id="replay-note")
                yield DataTable(id="replay-table", cursor_type="none", zebra_stripes=True)
                yield Static("", id="replay-chart")
                yield Static("", id="replay-verdict")
                yield DataTable(id="replay-turns", cursor_type="row")
                yield Horizontal(id="replay-compare")
            yield Static("enter run · ←→ scroll the table · ↑↓ pick a turn to compare · esc close", id="replay-hint")

    def _newest(self) -> Optional[str]:
        found = sessions.list_sessions()
        return found[0].id if found else None

    def on_mount(self) -> None:
        self.watch(self.app, "theme", self._theme_changed, init=False)
        self.query_one("#replay-blocks", Input).focus()
        self.query_one("#replay-turns", DataTable).display = False
        self.query_one("#replay-progress", ProgressBar).display = False  # idle, it would pulse as if running
        ident = self.query_one("#replay-session", Input).value.strip()
        if not ident:
            self._status("No session yet: send a message first (or type a session id).")
            return
        try:
            saved = replay.saved_comparisons(sessions.resolve(ident))
            if saved:
                self.show(replay.load_comparison(saved[-1]))
                self._status(f"Last replay {_stamp(saved[-1])} · enter runs it again")
        except Exception:  # noqa: BLE001 - an old or unreadable comparison is simply not shown
            pass

    def _theme_changed(self) -> None:
        if self.comparison is not None and not self._gone():  # its marks and text in the new theme's colours
            self.show(self.comparison)

    def _colour(self, name: str) -> str:
        """A theme's text colour (`$text-success`, …), readable on its backgrounds (contrast.py)."""
        value = self.app.get_css_variables().get(name, "")  # the theme's now (a theme watcher runs before the CSS)
        return value.removeprefix("ansi_")  # an ANSI theme's ("ansi_green") is the terminal's own, as Rich names it

    def _status(self, text: str) -> None:
        self.query_one("#replay-status", Static).update(text)

    def _gone(self) -> bool:
        """Closed while the worker ran. A dismissed screen still counts as attached while its widgets
        are being removed; textual's `display` is False from then on (it folds in closing and pruning)."""
        return not self.is_attached or not self.display

    # -- running ---------------------------------------------------------------------------------
    @on(Input.Submitted)
    @on(Button.Pressed, "#replay-run")
    def action_run(self) -> None:
        if self.running:
            return
        ident = self.query_one("#replay-session", Input).value.strip()
        blocks = self.query_one("#replay-blocks", Input).value
        repeats = self.query_one("#replay-repeats", Input).value.strip()
        if not ident:
            self._status("Type a session id (ctrl+o lists them).")
            return
        self.cancel = threading.Event()
        self.running = True
        bar = self.query_one("#replay-progress", ProgressBar)
        bar.display = True
        bar.update(total=None, progress=0)
        self._status("starting ...")
        self._run(self.app, ident, blocks, repeats)

    @work(thread=True, exclusive=True, group="replay")
    def _run(self, app, ident: str, blocks: str, repeats: str) -> None:
        """The replay itself. `app` is taken on the event loop: once the screen is dismissed it has no parent,
        and `self.app` in this thread would raise instead of reporting that the run stopped."""
        from dflash_tui.engines import UserError, load_engine

        def progress(done: int, total: int, label: str) -> None:
            app.call_from_thread(self._progress, done, total, label)

        try:
            sizes = replay.parse_block_sizes(blocks)
            if not repeats.isdigit():
                raise UserError(f"Runs '{repeats}' is not a whole number; give how many runs per block size, e.g. 3.")
            runs = check_repeats(int(repeats))
            session = sessions.load_session(ident)
            replay.recorded_turns(session)

            def compare(engine) -> replay.ReplayResult:
                return replay.run_replay(engine, session, sizes, progress=progress, cancel=self.cancel, repeats=runs)

            comparison = None
            conversation = app.conversation
            if conversation is not None:  # the chat's engine, when it runs the session's target: no second copy
                with conversation.lend_engine() as engine:
                    if engine is not None and replay.same_target(session, engine):
                        comparison = compare(engine)
            if comparison is None:
                engine = self._own_engine
                if engine is None or not replay.same_target(session, engine):
                    config = replay.engine_config_for(session)
                    server = server_text(config)  # the remote engine loads nothing here
                    app.call_from_thread(self._status, f"connecting to {server} ..." if server else
                                         f"loading {config.target} on the {config.engine} engine ...")
                    engine = self._own_engine = load_engine(config)
                comparison = compare(engine)
            path = replay.save_comparison(comparison, session.path)
        except replay.ReplayCancelled:
            app.call_from_thread(self._finished, None, "Replay stopped.")
            return
        except UserError as exc:
            app.call_from_thread(self._finished, None, f"error: {exc}")
            return
        except Exception as exc:  # noqa: BLE001 - shown in the screen, never a crash of the app
            app.call_from_thread(self._finished, None, f"error: unexpected {type(exc).__name__}: {exc}")
            return
        app.call_from_thread(self._finished, comparison, f"Saved replay {_stamp(path)}.")

    def _progress(self, done: int, total: int, label: str) -> None:
        if self._gone():
            return
        self.query_one("#replay-progress", ProgressBar).update(total=total, progress=done)
        self._status(f"{done}/{total} · {label}")

    def _finished(self, comparison: Optional[replay.ReplayResult], message: str) -> None:
        self.running = False
        if self._gone():
            return
        self._status(message)
        bar = self.query_one("#replay-progress", ProgressBar)
        bar.update(total=bar.total or 1, progress=bar.total or 1)
        if comparison is not None:
            self.show(comparison)

    # -- showing ---------------------------------------------------------------------------------
    def show(self, comparison: replay.ReplayResult) -> None:
        self.comparison = comparison
        table = self.query_one("#replay-table", DataTable)
        table.clear(columns=True)
        titles, cells = replay.table_rows(comparison)
        table.add_columns(*titles)
        column = replay.IDENTICAL_COLUMN
        for row in cells:
            mark = row[column]
            style = f"bold {self._colour('text-error')}" if replay.CROSS in mark else \
                self._colour("text-success") if replay.CHECK in mark else ""
            table.add_row(*row[:column], Text(mark, style=style), *row[column + 1:])
        drafted = replay.draft_line(comparison)  # which draft the rows ran (the chat's engine, when it ran them)
        note = repeats_note(comparison["rows"])
        self.query_one("#replay-note", Static).update(f"{drafted}\n{note}" if drafted else note)
        # the box is 98% of the screen; its border, padding and the scrollbar take 8 columns
        width = max(40, min(int(self.size.width * 0.98) - 8, 110)) if self.size.width else 100
        # a rich Group renders through rich itself, which keeps the chart's leading spaces (its alignment)
        chart = legible(Text.from_ansi(replay.chart(comparison, True, width, 12), no_wrap=True, overflow="crop"),
                        self._colour("text-primary"))
        self.query_one("#replay-chart", Static).update(Group(chart))
        lines = [replay.verdict(comparison), *replay.difference_lines(comparison), *comparison.get("warnings", [])]
        verdict = Text("\n".join(lines))
        if comparison["differences"]:
            verdict.stylize(f"bold {self._colour('text-error')}", 0, len(lines[0]))
        elif comparison["greedy"]:
            verdict.stylize(self._colour("text-success"), 0, len(lines[0]))
        self.query_one("#replay-verdict", Static).update(verdict)
        turns = self.query_one("#replay-turns", DataTable)
        turns.clear(columns=True)
        turns.add_columns("turn", "prompt", "tokens", "you")
        for t in comparison["turns"]:
            first = (t["user"].strip().splitlines() or [""])[0]
            turns.add_row(str(t["index"] + 1), str(t["prompt_tokens"]), str(t["recorded_tokens"]), first[:70],
                          key=str(t["index"]))
        turns.display = True
        self.show_turn(comparison["turns"][0]["index"] if comparison["turns"] else None)

    @on(DataTable.RowHighlighted, "#replay-turns")
    def _turn_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key is not None and event.row_key.value is not None:
            self.show_turn(int(event.row_key.value))

    def show_turn(self, index: Optional[int]) -> None:
        """One column per block size: the turn's text, draft-accepted tokens in green, the target's in blue,
        in the answer's shades for this theme (readable on a light one too)."""
        compare = self.query_one("#replay-compare", Horizontal)
        compare.remove_children()
        if index is None or self.comparison is None:
            return
        styles = origin_styles(theme_background(self.app.current_theme))
        columns = []
        for row in self.comparison["rows"]:
            turn = next((t for n, t in enumerate(row["turns"]) if t.get("index", n) == index), None)
            if turn is None:
                continue
            lengths = turn["acceptance_lengths"]  # None: the server did not report its steps
            tau = None if lengths is None else sum(lengths) / len(lengths) if lengths else 0.0
            drafted = sum(len(p[0]) for p in turn["pieces"] if p[1] == "draft")
            chars = sum(len(p[0]) for p in turn["pieces"]) or 1
            body = Text()
            body.append(f"block {row['block_size']} · tau {fixed(tau)} · {turn['decode_tokens_per_s']:.0f} tok/s\n",
                        style="bold")
            body.append(f"{100 * drafted / chars:.0f}% of the text from the draft\n", style="italic")  # dim fell under 4.5:1
            for d in self.comparison["differences"]:
                if d["turn"] == index and d["block_size"] == row["block_size"]:
                    margin = "?" if d["margin"] is None else f"{d['margin']:.3g}"
                    body.append(f"✗ differs from the {d['against']} at token {d['position']} (top-2 margin {margin})\n",
                                style=f"bold {self._colour('text-error')}")
            for text, origin in turn["pieces"]:
                body.append(printable(text), style=styles.get(origin, ""))
            columns.append(Static(body, classes="replay-column"))
        compare.mount_all(columns)

    def action_close(self) -> None:
        self.cancel.set()
        self.dismiss(None)


def legible(text: Text, colour: str) -> Text:
    """The chart in `colour`, the theme's $text-primary (4.5:1 on the box's background): plotext draws each
    bar's value inside the bar, in the bar's colour on the bar's colour; the value takes the background's
    colour on `colour` (reversed), as readable as the colour itself (black or white on plotext's blue
    reached only 3.7:1, and no ink reads on it in every terminal's palette)."""
    from rich.style import Style
    from rich.text import Span

    def ink(style: Style) -> Style:
        if style.color is None:
            return style
        return Style(color=colour, reverse=style.color == style.bgcolor)

    text.spans = [Span(span.start, span.end, ink(span.style if isinstance(span.style, Style) else
                                                 Style.parse(str(span.style)))) for span in text.spans]
    return text


def _stamp(path) -> str:
    """'20260101-120500' of '<session>.replay-20260101-120500.json': what tells saved replays apart, short
    enough for the status line at 80 columns."""
    return path.name.rsplit(".replay-", 1)[-1].removesuffix(".json")
