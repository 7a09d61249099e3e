"""Tables and charts for bench, replay and tune results (plain text; colour through click when asked)."""

from __future__ import annotations

from importlib.metadata import version
from typing import Optional

from dflash_tui.core.figures import UNKNOWN
from dflash_tui.measure.runs import spread

CHECK, CROSS = "✓", "✗"


def format_bytes(n: Optional[float]) -> str:
    """'1.5 MB'; '–' when unknown (None)."""
    if n is None:
        return UNKNOWN
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def histogram_text(histogram: Optional[list[int]], width: int = 16) -> str:
    """A compact histogram: one block character per acceptance length 1..B, its height the count relative
    to the most common length (· for none); '–' when unknown (None)."""
    if histogram is None:
        return UNKNOWN
    total = sum(histogram)
    if not total:
        return "-"
    bars = " ▁▂▃▄▅▆▇█"
    cells = [bars[min(8, max(1, round(8 * c / max(histogram))))] if c else "·" for c in histogram]
    return "".join(cells)


def histogram_line(histogram: Optional[list[int]]) -> str:
    """'1: 20% · 4: 80%': the share of steps per acceptance length ('–' when unknown)."""
    if histogram is None:
        return UNKNOWN
    total = sum(histogram)
    if not total:
        return "-"
    return " · ".join(f"{n}: {100 * c / total:.0f}%" for n, c in enumerate(histogram, 1) if c)


def times(value: Optional[float]) -> str:
    """A speedup cell: '2.10x', '-' when unknown."""
    return f"{value:.2f}x" if value is not None else "-"


def spread_cell(row) -> str:
    """How far a row's passes were apart, as a share of its best: '4%'; '-' with a single pass."""
    gap, best = spread(row), row["decode_tokens_per_s"]
    return f"{100 * gap / best:.0f}%" if gap is not None and best else "-"


def repeats_note(rows) -> str:
    """What the tok/s and spread columns mean, with the number of runs (one line of at most 70 columns)."""
    counts = sorted({row["repeats"] for row in rows})
    n = "/".join(str(c) for c in counts) or "1"
    return f"tok/s: best of {n} run{'s' if counts != [1] else ''} after a warm-up; spread: (max - min) / max"


def millis(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def mark(value: Optional[bool]) -> str:
    return {True: CHECK, False: CROSS, None: "-"}[value]


def table(titles: list[str], cells: list[list[str]], left=(), marks: Optional[int] = None,
          colour: bool = False) -> list[str]:
    """Columns two spaces apart, right-aligned except those in `left`, under a rule; with `colour`, the
    cells of column `marks` are red where they hold ✗ and green where they hold ✓."""
    import click

    widths = [max(len(t), *(len(c[i]) for c in cells)) for i, t in enumerate(titles)]

    def line(values: list[str]) -> str:
        out = []
        for i, (value, width) in enumerate(zip(values, widths)):
            text = value.ljust(width) if i in left else value.rjust(width)
            if colour and i == marks:
                if CROSS in value:
                    text = click.style(text, fg="red", bold=True)
                elif CHECK in value:
                    text = click.style(text, fg="green")
            out.append(text)
        return "  ".join(out).rstrip()

    return [line(titles), "  ".join("-" * w for w in widths).rstrip(), *(line(c) for c in cells)]


def chart(rows, colour: bool = False, width: int = 80, height: int = 14) -> str:
    """A plotext bar chart of speedup and tau per block size (a plain-text one without colour)."""
    labels = [str(r["block_size"]) for r in rows]
    speedups = [round(r["speedup"] or 0.0, 2) for r in rows]
    taus = [round(r["tau"] or 0.0, 2) for r in rows]  # an unknown tau draws no bar
    try:
        text = _plotext_chart(labels, speedups, taus, width, height)
    except Exception:  # noqa: BLE001 - a chart is a nicety; fall back to text bars
        return _text_chart(labels, speedups, taus)
    if not colour:
        import plotext

        text = plotext.uncolorize(text)
    return text.rstrip("\n")


def _plotext_chart(labels, speedups, taus, width, height) -> str:
    import plotext as plt

    if int(version("plotext").split(".")[0]) >= 6:  # plotext 6: the explicit-figure API
        figure = plt.figure
        figure.clear()
        figure.subplots(1, 2)
        figure.theme("simple")  # coloured bars on the terminal's own background
        figure.plot_size(width, height)
        for col, (values, title) in enumerate(((speedups, "speedup vs block 1"), (taus, "tau (mean acceptance)")), 1):
            sub = figure.subplot(1, col)
            sub.draw(sub.bar(labels, values, labeled=True, width=0.6))
            sub.title(title)
            sub.label("block size", "x")
        return str(figure.build())
    plt.clf()  # plotext 5: the functional API
    plt.subplots(1, 2)
    plt.theme("clear")
    plt.plotsize(width, height)
    for col, (values, title) in enumerate(((speedups, "speedup vs block 1"), (taus, "tau (mean acceptance)")), 1):
        plt.subplot(1, col)
        plt.bar(labels, values)
        plt.title(title)
        plt.xlabel("block size")
    return plt.build()


def _text_chart(labels, speedups, taus) -> str:
    top_s, top_t = max(speedups + [1e-9]), max(taus + [1e-9])
    lines = ["block  speedup                        tau"]
    for label, s, t in zip(labels, speedups, taus):
        lines.append(f"{label:>5}  {'█' * round(20 * s / top_s):<20} {s:5.2f}x  {'█' * round(20 * t / top_t):<20} {t:5.2f}")
    return "\n".join(lines)
