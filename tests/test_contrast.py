"""Every text style reads on every built-in theme (issue 46, item 6): 4.5:1 or more (WCAG AA), the ghosts,
meant to recede, 3:1; in truecolor and in 256 colours (tmux's default); the ANSI themes in four terminals'
default palettes. Accepted draft and target tokens differ in lightness and weight, not only in hue, and
their key stays on screen at 80x24. The figures come from what the app paints: the theme's CSS
variables as the app hands them to Textual, and every run of text the terminal gets from the real app."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import waiting

pytest.importorskip("textual")

from textual.color import Color  # noqa: E402 - after the importorskip above
from textual.theme import BUILTIN_THEMES  # noqa: E402 - after the importorskip above

from dflash_tui.tui.contrast import (  # noqa: E402 - after the importorskip above
    ANSI_TEXT,
    GHOST_CONTRAST,
    MIN_CONTRAST,
    ORIGIN_SEPARATION,
    origin_styles,
    readable_variables,
    theme_background,
)

# The 16 ANSI colours (0-7, then the bright 8-15) of four terminals as they ship:
TERMINAL_PALETTES = {
    # xterm's defaults (its XTerm-col.ad resources; vte's COLOR_STYLE_XTERM table alike)
    "xterm": ["000000", "cd0000", "00cd00", "cdcd00", "0000ee", "cd00cd", "00cdcd", "e5e5e5",
              "7f7f7f", "ff0000", "00ff00", "ffff00", "5c5cff", "ff00ff", "00ffff", "ffffff"],
    # the IBM VGA text-mode palette (the Linux console's default)
    "VGA": ["000000", "aa0000", "00aa00", "aa5500", "0000aa", "aa00aa", "00aaaa", "aaaaaa",
            "555555", "ff5555", "55ff55", "ffff55", "5555ff", "ff55ff", "55ffff", "ffffff"],
    # macOS Terminal.app's "Basic" profile (Wikipedia's "ANSI escape code" table, Terminal.app column)
    "macOS Terminal": ["000000", "c23621", "25bc24", "adad27", "492ee1", "d338d3", "33bbc8", "cbcccd",
                       "818383", "fc391f", "31e722", "eaec23", "5833ff", "f935f8", "14f0f0", "e9ebeb"],
    # GNOME Terminal's default palette, Tango (gnome-terminal's terminal-profile.c, as vte's COLOR_STYLE_TANGO)
    "GNOME Terminal": ["2e3436", "cc0000", "4e9a06", "c4a000", "3465a4", "75507b", "06989a", "d3d7cf",
                       "555753", "ef2929", "8ae234", "fce94f", "729fcf", "ad7fa8", "34e2e2", "eeeeec"],
}
ANSI_NAMES = ["black", "red", "green", "yellow", "blue", "magenta", "cyan", "white"]
ANSI_NAMES += [f"bright_{name}" for name in ANSI_NAMES]
# the terminal's own text and background under an ANSI theme: a dark theme is for a terminal whose
# profile is white (7) on black (0), a light one for black on bright white (15) (Tango's dark and light
# schemes; xterm's and Terminal.app's light default)
DEFAULT_INK = {True: (7, 0), False: (0, 15)}


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
    from rich.color import Color as RichColor
    from rich.color import ColorSystem

    c = RichColor.from_rgb(*rgb).downgrade(ColorSystem.EIGHT_BIT).get_truecolor()
    return (c.red, c.green, c.blue)


def rgb(hex_colour: str) -> tuple:
    return tuple(int(hex_colour.lstrip("#")[i:i + 2], 16) for i in (0, 2, 4))


# -- the theme variables, as the app hands them to Textual -----------------------------------------

# text variable -> the backgrounds the app draws it on (dflash.tcss and Textual's widgets' own CSS)
TEXT_ON = {
    # answers, messages, modals ($surface), toasts ($panel-lighten-1), the stats line ($boost), tables
    "foreground": ("background", "surface", "panel", "panel-lighten-1", "boost"),
    "text-muted": ("background", "surface", "panel"),  # titles, hints, the answer's figures
    **{f"text-{kind}": ("background", "surface", "panel-lighten-1")  # notices, marks, toast titles, replay
       for kind in ("primary", "secondary", "accent", "warning", "error", "success")},
    "footer-key-foreground": ("footer-background",),
    "footer-description-foreground": ("footer-background",),
    "block-cursor-foreground": ("block-cursor-background",),  # a table's highlighted row
    "header-foreground": ("primary-background",),  # the header
    **{f"markdown-h{level}-color": ("background",) for level in range(1, 7)},  # f2's Markdown headings
}


def app_variables(theme) -> dict[str, str]:
    """The CSS variables the app hands Textual for `theme`: Textual's App.get_css_variables (the colour
    system, then the theme's own variables), through the app's readable_variables (the real-app test
    below checks this is what the running app returns)."""
    return readable_variables({**theme.to_color_system().generate(), **theme.variables}, theme.dark)


def painted(value: str, under: Color) -> Color:
    """A variable's colour as painted over `under` (translucent ones blended; "auto" is the text colour
    Textual picks for `under`)."""
    word, _, alpha = value.partition(" ")
    if word == "auto":  # Textual's CSS "auto 87%": the contrasting text colour at 87% (Color.parse reads no "auto")
        return under + under.get_contrast_text(float(alpha.rstrip("%") or 100) / 100)
    colour = Color.parse(value)
    return under + colour if colour.a < 1 else colour


def truecolor_pairs(theme) -> list[tuple[str, Color, Color]]:
    """(what, text, background) for every text variable on every background it is drawn on, and on it
    focused: Textual tints a focused input, table or button 5% toward its text."""
    variables = app_variables(theme)
    background = Color.parse(variables["background"])
    pairs = []
    for name, behind in TEXT_ON.items():
        for where in behind:
            under = painted(variables[where], background)
            text = painted(variables[name], under)
            pairs += [(f"${name} on ${where}", text, under),
                      (f"${name} on ${where}, focused", text, under.tint(text.with_alpha(0.05)))]
    return pairs


def ansi_ink(value: str, palette: list[str], dark: bool, foreground: bool) -> tuple:
    """An ANSI theme's variable as `palette` shows it: an ANSI colour is the palette's, the default (or
    a transparent background) the terminal's own (`DEFAULT_INK`)."""
    name = value.split()[0]
    if name in ("ansi_default", "transparent"):
        return rgb(palette[DEFAULT_INK[dark][0 if foreground else 1]])
    assert name.startswith("ansi_"), value
    return rgb(palette[ANSI_NAMES.index(name.removeprefix("ansi_"))])


ANSI_THEMES = [name for name, theme in BUILTIN_THEMES.items() if theme.ansi]
TRUECOLOR_THEMES = [name for name in BUILTIN_THEMES if name not in ANSI_THEMES]


@pytest.mark.parametrize("name", TRUECOLOR_THEMES)
def test_every_text_variable_reaches_4_5_to_1_on_every_truecolor_theme(name):
    """The lowest were 3.05 to 3.4 on the light themes (footer keys, notices, headers) at the old 3:1
    floor; the header's text was 3.7:1 on solarized's blue, the muted text under 4.5:1 in 256 colours."""
    failures = []
    for what, text, under in truecolor_pairs(BUILTIN_THEMES[name]):
        for how, a, b in (("truecolor", text.rgb, under.rgb),
                          ("256 colours", in_256_colours(text.rgb), in_256_colours(under.rgb))):
            if wcag(a, b) < MIN_CONTRAST:
                failures.append(f"{what}: {wcag(a, b):.2f} in {how}")
    assert not failures, failures


@pytest.mark.parametrize("name", ANSI_THEMES)
@pytest.mark.parametrize("terminal", TERMINAL_PALETTES)
def test_every_text_variable_of_an_ansi_theme_reaches_4_5_to_1_in_four_terminals(name, terminal):
    """The ANSI themes paint in the terminal's colours: judged in four default palettes. ansi-dark's
    footer keys (magenta) were 1.9:1 in GNOME Terminal, its warnings (yellow) 4.0:1 on VGA; ansi-light's
    warnings (bright red) 3.1:1, its success (green) 2.1:1."""
    theme, palette = BUILTIN_THEMES[name], TERMINAL_PALETTES[terminal]
    variables = app_variables(theme)
    failures = []
    for text, behind in TEXT_ON.items():
        for where in behind:
            ratio = wcag(ansi_ink(variables[text], palette, theme.dark, True),
                         ansi_ink(variables[where], palette, theme.dark, False))
            if ratio < MIN_CONTRAST:
                failures.append(f"${text} ({variables[text]}) on ${where}: {ratio:.2f}")
    assert not failures, failures
    assert set(ANSI_TEXT[theme.dark]) <= set(TEXT_ON)  # every colour the app picks is judged here


def origin_backgrounds(theme) -> list[tuple[str, tuple]]:
    """Where the answer's colours are drawn: the background, and the stats line's boost over it (its key);
    an ANSI theme's is the terminal's own background in each palette."""
    if theme.ansi:
        return [(terminal, rgb(palette[DEFAULT_INK[theme.dark][1]])) for terminal, palette in TERMINAL_PALETTES.items()]
    variables = app_variables(theme)
    background = Color.parse(variables["background"])
    return [("background", background.rgb), ("boost", painted(variables["boost"], background).rgb)]


@pytest.mark.parametrize("name", list(BUILTIN_THEMES))
def test_the_answers_colours_read_and_differ_in_more_than_hue(name):
    """Accepted draft and target tokens at 4.5:1 on the answer's background, the ghosts at 3:1; draft
    and target stand 1.4:1 apart in lightness (they were 1.01:1 on every dark theme: hue alone told them
    apart) in truecolor, and in 256 colours on every theme whose 256-colour background leaves room for it
    (catppuccin-frappe's is #5F5F5F there: both must be pale, 1.18:1); the draft's are bold besides. No
    strike-through: the ghosts, italic and underlined, let the answer read through them."""
    theme = BUILTIN_THEMES[name]
    styles = origin_styles(theme_background(theme))
    colours = {kind: styles[kind].color.triplet for kind in ("draft", "target", "ghost")}
    failures = []
    for where, under in origin_backgrounds(theme):
        for kind, colour in colours.items():
            floor = GHOST_CONTRAST if kind == "ghost" else MIN_CONTRAST
            # a 256-colour terminal shows the colour from its cube; an ANSI theme's background stays the terminal's
            shown = {"truecolor": wcag(colour, under),
                     "256 colours": wcag(in_256_colours(colour), under if theme.ansi else in_256_colours(under))}
            failures += [f"{kind} on {where}: {ratio:.2f} in {how}" for how, ratio in shown.items() if ratio < floor]
    draft, target = colours["draft"], colours["target"]
    assert wcag(draft, target) >= ORIGIN_SEPARATION, wcag(draft, target)
    assert wcag(in_256_colours(draft), in_256_colours(target)) >= (1.15 if name == "catppuccin-frappe" else
                                                                    ORIGIN_SEPARATION)
    assert styles["draft"].bold and not styles["target"].bold
    ghost = styles["ghost"]
    assert ghost.italic and ghost.underline and not ghost.strike
    assert not failures, failures


# -- the real app: every run of text on screen, and the colours' key at 80x24 ------------------------


def _is_text(ch: str) -> bool:
    """A character read as text: not a space, a box or block drawing (borders, scrollbars, bars) or braille."""
    import unicodedata

    code = ord(ch)
    if ch.isspace() or 0x2500 <= code <= 0x259F or 0x2800 <= code <= 0x28FF:
        return False
    return unicodedata.category(ch)[0] in "LNPS"


def _shown(colour, palette, dark: bool, foreground: bool, eight_bit: bool):
    """A segment's colour as the terminal shows it: None for the terminal's default on a truecolor theme
    (not judged); on an ANSI theme (`palette`) the ANSI and default colours are the palette's."""
    from rich.color import ColorType

    if colour is None or colour.is_default:
        return rgb(palette[DEFAULT_INK[dark][0 if foreground else 1]]) if palette else None
    if palette and colour.type in (ColorType.STANDARD, ColorType.EIGHT_BIT) and colour.number < 16:
        return rgb(palette[colour.number])
    c = colour.get_truecolor()
    return in_256_colours((c.red, c.green, c.blue)) if eight_bit else (c.red, c.green, c.blue)


def unreadable_text(app, palette=None) -> list[str]:
    """Every run of text on the screen as the terminal gets it (after Textual's own filters) under 4.5:1
    against its background (a ghost under 3:1), in truecolor or in 256 colours: "text (ratio, how)". A
    modal screen is checked inside its box only (the screen behind it is meant to fade). Dim text counts as
    half-way to its background (Textual's own rendering of dim). On an ANSI theme, `palette` gives the
    terminal's colours."""
    from textual.command import CommandPalette
    from textual.screen import ModalScreen

    screen, dark = app.screen, app.current_theme.dark
    ghost = origin_styles(theme_background(app.current_theme))["ghost"]
    if isinstance(screen, CommandPalette):
        region = screen.query_one("#--container").region
    elif isinstance(screen, ModalScreen):  # its box; Textual mounts a toast rack first, which was taken for it
        region = next(child for child in screen.children if not child.has_class("-textual-system")).region
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
            is_ghost = style.italic and style.underline and style.color == ghost.color
            floor = GHOST_CONTRAST if is_ghost else MIN_CONTRAST
            for how, eight_bit in (("truecolor", False), ("256 colours", True)):
                f = _shown(fg, palette, dark, not style.reverse, eight_bit)
                b = _shown(bg, palette, dark, style.reverse, eight_bit)
                if f is None or b is None:
                    continue
                if style.dim:
                    f = tuple(int(b[i] + (f[i] - b[i]) * 0.5) for i in range(3))
                if wcag(f, b) < floor:
                    found.append(f"{segment.text.strip()!r} ({wcag(f, b):.2f}, {how})")
    return found


async def every_theme_reads(pilot, where: str) -> list[str]:
    """The text on the screen under its floor on each theme the app offers; an ANSI theme's in each of
    the four terminals' palettes."""
    app, failures = pilot.app, []
    for name in app.available_themes:
        app.theme = name
        await pilot.pause()
        if app.current_theme.ansi:
            for terminal, palette in TERMINAL_PALETTES.items():
                failures += [f"{where} on {name} in {terminal}: {text}" for text in unreadable_text(app, palette)]
        else:
            failures += [f"{where} on {name}: {text}" for text in unreadable_text(app)]
    return failures


@pytest.fixture
def profile(tmp_path, pair):
    """Answers of 24 tokens: enough to show every origin."""
    from tests.tiny import write_profile

    return write_profile(tmp_path / "tiny.toml", *pair, max_new_tokens=24)


@pytest.mark.asyncio
async def test_every_text_on_screen_reaches_4_5_to_1_on_every_builtin_theme(profile, engine, data_dir):
    """Every run of text the terminal gets, in truecolor and in 256 colours (tmux), the ANSI themes in
    four terminals: notices were #FEA62B on #E0E0E0 (1.49:1) on textual-light, draft-written thinking text
    2.39:1, the footer's keys 1.8:1 on atom-one-light and catppuccin-latte, the cancelled mark 2.1:1, a
    modal's text on solarized-dark 2.2:1 in 256 colours; then at 3:1, the light themes' footer keys,
    notices, accepted tokens and header at 3.05 to 3.4:1. At 80x24, with a resumed cancelled answer, a live
    one with its thinking and ghosts, the notices, a toast of each kind, and the session picker."""
    from textual.widgets._toast import Toast

    from dflash_tui.core import sessions
    from dflash_tui.tui.screens import SessionsScreen
    from dflash_tui.tui.widgets import AnswerView
    from tests.tui_helpers import make_app, ready, recorded_turn, send, write_session

    session = write_session("20260101-100000-0000",
                            recorded_turn(engine, "stopped", "half an answ", status="cancelled"),
                            recorded_turn(engine, "think", "<think>\nadd the ones, then the tens\n</think>\n\n123"))
    app = make_app(profile, engine, block_size=4, resume=sessions.load_session(session))
    async with app.run_test(size=(80, 24), notifications=True) as pilot:  # the pilot hides toasts by default
        await ready(pilot)
        await send(pilot, "colours")
        await pilot.press("ctrl+g")  # ghosts shown too
        answers = app.screen.query(AnswerView)
        assert [a.status for a in answers] == ["cancelled", "completed", "completed"]
        thinking = answers[1]
        assert {kind for _, kind in thinking.segments} == {"draft", "target", "ghost"}
        for severity in ("information", "warning", "error"):
            app.notify(f"a {severity} toast", severity=severity, timeout=600)
        await waiting.until(pilot, lambda: sum("toast" in str(t.render()) for t in app.screen.query(Toast)) == 3, 60)
        app.chat.mark(answers[0])  # marked (alt+up, ctrl+f) on its tinted background, and scrolled to
        await pilot.pause()
        shown = "\n".join(strip.text for strip in app.screen._compositor.render_strips())
        assert "⏹ cancelled" in shown and "thinking · 25 tokens" in shown and "error toast" in shown, shown
        failures = await every_theme_reads(pilot, "chat")
        app.theme = "textual-light"
        await pilot.pause()
        answer = answers.last()  # its text re-rendered in the theme's colours, picked for its background
        assert {span.style.color for span in answer.answer_rich.spans} <= \
            {style.color for style in answer.styles_by_origin.values()}  # Markdown adds only attributes
        assert answer.styles_by_origin["draft"] != origin_styles(Color(0, 0, 0))["draft"]
        await pilot.press("ctrl+o")  # a modal: its box on $surface, a table's header and cursor (f1's alike)
        await waiting.until(pilot, lambda: isinstance(app.screen, SessionsScreen)
                            and app.screen.query_one("DataTable").row_count, 60)
        failures += await every_theme_reads(pilot, "sessions")
        assert not failures, failures


@pytest.mark.asyncio
async def test_the_replay_screen_reads_at_4_5_to_1_on_every_builtin_theme(profile, engine, data_dir):
    """The replay's side-by-side text takes the answer's colours for the theme, as the chat does; its marks
    and verdict take the theme's readable success and error colours (green was 2.9:1 on textual-light), and
    the chart's bar labels stand out from their bars (plotext drew them in the bar's own colour, 1:1)."""
    from rich.style import Style

    from dflash_tui.core import sessions
    from dflash_tui.tui.screens import ReplayScreen
    from tests.tui_helpers import SMALL, make_app, ready

    writer = sessions.SessionWriter({"profile": {"name": "tiny"}, "engine": "cuda"})
    writer.append_turn({"status": "completed", "user": "What is 48 + 75?", "answer": "48 + 75 = 123.", "settings": {}})
    writer.close()
    saved = (Path(__file__).parent / "fixtures" / "replay-3-runs.json").read_text()
    (writer.path.parent / f"{writer.id}.replay-20260101-120500.json").write_text(saved)
    app = make_app(profile, engine)
    async with app.run_test(size=SMALL) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+r")
        await waiting.until(pilot, lambda: isinstance(app.screen, ReplayScreen) and app.screen.query(".replay-column"))
        failures = await every_theme_reads(pilot, "replay")
        assert not failures, failures
        app.theme = "textual-light"
        await pilot.pause()
        bg = theme_background(app.current_theme)
        styles = [Style.parse(str(span.style)) for column in app.screen.query(".replay-column")
                  for span in column.content.spans]
        colours = {style.color.triplet for style in styles if style.color and style.color.triplet}
        assert len(colours) == 2  # draft and target, in the answer's colours for this theme
        for colour in colours:
            assert wcag(colour, (bg.r, bg.g, bg.b)) >= MIN_CONTRAST


@pytest.mark.asyncio
async def test_the_colours_key_stays_on_screen_at_80x24_after_an_answer(profile, engine, data_dir):
    """At 80x24 the welcome (which named the colours) was gone after the first answer, and with it the only
    key on screen (the side panel's is folded away there): the header's right end now names them, in
    them, on the answer's background ("ghost" too while ctrl+g shows the ghosts). The welcome reads on
    every theme, and the app's CSS variables are those the computations above judge."""
    from tests.tui_helpers import SMALL, make_app, ready, send

    app = make_app(profile, engine, block_size=4)
    async with app.run_test(size=SMALL) as pilot:
        await ready(pilot)
        failures = await every_theme_reads(pilot, "welcome")
        assert not failures, failures
        app.theme = "textual-dark"
        await send(pilot, "colours")

        def header():
            return app.screen._compositor.render_strips()[0]

        styles = origin_styles(theme_background(app.current_theme))
        for ghosts in (False, True):
            if ghosts:
                await pilot.press("ctrl+g")
                await waiting.until(pilot, lambda: "ghost " in header().text)
            line = header()
            words = {segment.text: segment.style for segment in line if segment.text in ("draft", "target", "ghost")}
            assert set(words) == {"draft", "target"} | ({"ghost"} if ghosts else set()), line.text
            for word, style in words.items():
                assert (style.color, style.bgcolor.triplet.hex.upper()) == \
                    (styles[word].color, theme_background(app.current_theme).hex)
            assert line.text.rstrip().endswith("ghost" if ghosts else "target")
        for name in ("textual-light", "ansi-dark"):
            app.theme = name
            await pilot.pause()
            assert app.get_css_variables() == app_variables(app.current_theme)
