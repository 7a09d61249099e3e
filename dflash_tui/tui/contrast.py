"""Text the reader can read on every built-in theme: WCAG contrast of at least `MIN_CONTRAST` (4.5:1, AA for
body text), both in truecolor and as a 256-colour terminal (tmux's default) renders the colours; the
rejected draft tokens (ghosts), meant to recede, at `GHOST_CONTRAST` (3:1).

Textual's themes pick their accent, warning and footer colours for looks, and some fall under 2:1 on a
light background (atom-one-light's warning, catppuccin-latte's footer keys). `readable_variables` nudges
each theme variable that colours text until it stands out from the background it is drawn on; the app
applies it to the CSS variables of whatever theme is chosen. An ANSI theme's colours are the terminal's:
there the text variables take the ANSI colours that reach 4.5:1 in the common default palettes (xterm,
VGA, macOS Terminal, GNOME Terminal's Tango; tests/test_contrast.py holds them), `ANSI_TEXT`."""

from __future__ import annotations

from functools import lru_cache

from rich.color import Color as RichColor
from rich.color import ColorSystem
from rich.style import Style
from textual.color import Color, ColorParseError
from textual.theme import Theme

MIN_CONTRAST = 4.5  # WCAG AA for text: every text style must reach it on every theme
GHOST_CONTRAST = 3.0  # the rejected proposals recede, yet stay legible (WCAG's floor for large text)
ORIGIN_SEPARATION = 1.4  # draft and target differ in lightness too: at least this contrast between the two
FOCUS_TINT = 0.05  # Textual tints a focused input, table or button this much toward its text colour

BLACK, WHITE = Color(0, 0, 0), Color(255, 255, 255)

# theme variables that colour text -> the variables of the backgrounds it is drawn on
TEXT_VARIABLES = {
    # solarized-dark's foreground is 2.2:1 on its surface in 256 colours; toasts are on panel-lighten-1; the
    # stats line on boost (a tint over the background)
    "foreground": ("background", "surface", "panel", "panel-lighten-1", "boost"),
    **{f"text-{kind}": ("background", "surface", "panel-lighten-1") for kind in
       ("primary", "secondary", "accent", "warning", "error", "success")},
    "footer-key-foreground": ("footer-background",),
    "footer-description-foreground": ("footer-background",),
    "footer-foreground": ("footer-background",),
    "block-cursor-foreground": ("block-cursor-background",),  # a table's selected row
    "header-foreground": ("primary-background",),  # the header's text (dflash.tcss)
    **{f"markdown-h{level}-color": ("background",) for level in range(1, 7)},  # f2's Markdown headings
}
# $text-muted is "auto 60%" (the text colour at 60% over whatever background): under 3:1 in 256 colours on
# some dark themes; 84% is the least that reaches 4.5:1 on every theme's background, surface and panel
TEXT_MUTED = "auto 85%"

# an ANSI theme's text variables, dark and light: the ANSI colours at 4.5:1 or more on the palette's black
# (dark) or bright white (light) in each default palette. On a light one only black, red and blue reach it,
# so warnings take red there (errors too: the marks say which) and the accents, blue; on a dark one no red
# does (Tango's bright red is 3.0:1), so errors are bright yellow there, as warnings, bold by their marks.
ANSI_TEXT = {
    True: {"text-primary": "ansi_bright_cyan", "text-secondary": "ansi_bright_cyan",
           "text-accent": "ansi_bright_green", "text-success": "ansi_bright_green",
           "text-warning": "ansi_bright_yellow", "text-error": "ansi_bright_yellow",
           "footer-key-foreground": "ansi_bright_cyan",
           **{f"markdown-h{level}-color": "ansi_bright_cyan" for level in range(1, 7)}},
    False: {"text-primary": "ansi_blue", "text-secondary": "ansi_blue", "text-accent": "ansi_blue",
            "text-success": "ansi_blue", "text-warning": "ansi_red", "text-error": "ansi_red",
            "footer-key-foreground": "ansi_blue",
            **{f"markdown-h{level}-color": "ansi_blue" for level in range(1, 7)}},
}


def contrast(a: Color, b: Color) -> float:
    """WCAG contrast ratio of two colours (1 to 21)."""
    def luminance(c: Color) -> float:
        channels = [v / 255 for v in (c.r, c.g, c.b)]
        r, g, b = [v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4 for v in channels]
        return 0.2126 * r + 0.7152 * g + 0.0722 * b

    light, dark = sorted((luminance(a), luminance(b)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


def in_256_colours(colour: Color) -> Color:
    """`colour` as a 256-colour terminal (tmux's default) shows it."""
    rgb = RichColor.from_rgb(colour.r, colour.g, colour.b).downgrade(ColorSystem.EIGHT_BIT).get_truecolor()
    return Color(rgb.red, rgb.green, rgb.blue)


def reads_on(colour: Color, background: Color, floor: float = MIN_CONTRAST) -> bool:
    """Whether `colour` reaches `floor` on `background`, in truecolor and in 256 colours."""
    return contrast(colour, background) >= floor and \
        contrast(in_256_colours(colour), in_256_colours(background)) >= floor


def reads_on_all(colour: Color, backgrounds: tuple[Color, ...] | list[Color], floor: float = MIN_CONTRAST,
                 focus: bool = False) -> bool:
    """Whether `colour` reaches `floor` on every background; with `focus`, on each as Textual tints a focused
    input, table or button too (`FOCUS_TINT` toward its text colour)."""
    tinted = [b.tint(colour.with_alpha(FOCUS_TINT)) for b in backgrounds] if focus else []
    return all(reads_on(colour, b, floor) for b in [*backgrounds, *tinted])


def readable(colour: Color, *backgrounds: Color, floor: float = MIN_CONTRAST, focus: bool = False) -> Color:
    """`colour`, moved away from the (first) background's lightness until it reaches `floor` on every
    background (`reads_on_all`), in truecolor and as a 256-colour terminal renders both; black or white,
    whichever stands out more, where no shade on that side does (white text on a mid-blue header)."""
    dark = backgrounds[0].brightness < 0.5
    for _ in range(40):
        if reads_on_all(colour, backgrounds, floor, focus):
            return colour
        colour = colour.lighten(0.03) if dark else colour.darken(0.03)
    return max((BLACK, WHITE), key=lambda ink: min(contrast(ink, b) for b in backgrounds))


# an ANSI theme paints on the terminal's own background: from black to GNOME Terminal's Tango #2E3436 on a
# dark one, white to macOS Terminal's #E9EBEB on a light one; text readable on the nearer of each pair is on both
ANSI_BACKGROUND = {True: Color.parse("#2E3436"), False: Color.parse("#E9EBEB")}


def theme_background(theme: Theme) -> Color:
    """The colour a theme paints behind text; an ANSI theme's is the terminal's (`ANSI_BACKGROUND`)."""
    background = Color.parse(theme.to_color_system().generate()["background"])
    if background.ansi is not None:
        return ANSI_BACKGROUND[theme.dark]
    return background


def _solid(value: str, under: Color | None = None) -> Color | None:
    """A variable's colour as painted (a translucent one over `under`, "auto" as the text colour Textual
    picks for `under`); None for ANSI colours or where `under` is needed and not given."""
    word, _, alpha = value.partition(" ")
    try:  # "auto 87%" is Textual's CSS for the contrasting text colour at 87%; Color.parse reads no "auto"
        colour = Color(0, 0, 0, float(alpha.rstrip("%") or 100) / 100, auto=True) if word == "auto" else \
            Color.parse(value)
    except (ColorParseError, ValueError):
        return None
    if colour.ansi is not None:
        return None
    if colour.auto:
        return None if under is None else under + under.get_contrast_text(colour.a)
    return (under + colour) if under is not None and colour.a < 1 else colour.with_alpha(1.0)


def readable_variables(variables: dict[str, str], dark: bool = True) -> dict[str, str]:
    """A theme's CSS variables with every text colour nudged to MIN_CONTRAST on the backgrounds it is
    drawn on (see TEXT_VARIABLES), focused or not, and $header-foreground for the header's text; an ANSI
    theme's (`dark` or light) take `ANSI_TEXT`."""
    background = _solid(variables.get("background", ""))
    if background is None:
        return {**variables, **ANSI_TEXT[dark], "header-foreground": "ansi_default"}
    fixed = {**variables, "text-muted": TEXT_MUTED, "header-foreground": variables.get("text", "auto 87%")}
    for name, behind in TEXT_VARIABLES.items():
        backgrounds = [c for c in (_solid(fixed.get(b, ""), background) for b in behind) if c is not None]
        if len(backgrounds) < len(behind):
            continue
        colour = _solid(fixed.get(name, ""), backgrounds[0])
        if colour is None:
            continue
        if not reads_on_all(colour, backgrounds, focus=True):
            colour = readable(colour, *backgrounds, focus=True)
            fixed[name] = colour.hex
        if len(behind) == 1 and not reads_on_all(colour, backgrounds, focus=True):
            # no text reads on this fill (catppuccin-latte's purple, which 256 colours show lighter): it gives way
            fixed[behind[0]] = _fill(backgrounds[0], colour).hex
    return fixed


def _fill(fill: Color, text: Color) -> Color:
    """`fill` moved away from `text`'s lightness until `text` reads on it, focused or not."""
    for _ in range(40):
        if reads_on_all(text, [fill], focus=True):
            break
        fill = fill.darken(0.03) if text.brightness >= 0.5 else fill.lighten(0.03)
    return fill


# (colour, attributes) per origin, for dark and for light backgrounds. The draft's accepted tokens are bold
# and differ from the target's in lightness as well (ORIGIN_SEPARATION), so hue is not all that tells them
# apart; the ghosts recede: italic, underlined (they read through, unlike a strike-through), muted.
PALETTES = {
    True: {"draft": ("#83ec8c", "bold"), "target": ("#58a6ff", ""), "ghost": ("#b57f7f", "italic underline")},
    False: {"draft": ("#1a7f37", "bold"), "target": ("#002d97", ""), "ghost": ("#a46a6a", "italic underline")},
}


def _shades(colour: Color, backgrounds: tuple[Color, ...]) -> list[tuple[int, Color]]:
    """`colour` lightened or darkened by 2 Lab units a step (the steps counted), those at MIN_CONTRAST on
    every background."""
    shades: dict[Color, int] = {}
    for step in sorted(range(-50, 51), key=abs):  # the nearest first: a shade clamped to white counts once
        shades.setdefault(colour.darken(step / 50), abs(step))
    return [(steps, shade) for shade, steps in shades.items() if all(reads_on(shade, b) for b in backgrounds)]


def _draft_and_target(draft: Color, target: Color, backgrounds: tuple[Color, ...]) -> tuple[Color, Color]:
    """The shades of the two nearest the palette's that reach MIN_CONTRAST on the backgrounds and stand
    ORIGIN_SEPARATION apart, in truecolor and in 256 colours where a pair does (catppuccin-frappe's
    background is #5F5F5F in 256 colours: no pair does), else in truecolor."""
    pairs = [(not reads_on(d, t, ORIGIN_SEPARATION), d_steps + t_steps, d, t)
             for d_steps, d in _shades(draft, backgrounds) for t_steps, t in _shades(target, backgrounds)
             if contrast(d, t) >= ORIGIN_SEPARATION]
    _, _, draft, target = min(pairs, key=lambda pair: pair[:2])
    return draft, target


@lru_cache(maxsize=64)
def origin_styles(background: Color) -> dict[str, Style]:
    """The answer's styles for text on `background`: draft, target, ghost and plain. The stats line's key
    sits on the theme's boost, a 4% tint over the background, so the colours hold on that too."""
    palette = PALETTES[background.brightness < 0.5]
    backgrounds = (background, background + background.get_contrast_text(0.04))
    colours = {kind: Color.parse(colour) for kind, (colour, _) in palette.items()}
    colours["draft"], colours["target"] = _draft_and_target(colours["draft"], colours["target"], backgrounds)
    colours["ghost"] = readable(colours["ghost"], *backgrounds, floor=GHOST_CONTRAST)
    styles = {kind: Style.parse(f"{attributes} {colours[kind].hex}".strip())
              for kind, (_, attributes) in palette.items()}
    return {**styles, "plain": Style()}
