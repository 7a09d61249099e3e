"""Text the reader can read on every built-in theme: WCAG contrast of at least `MIN_CONTRAST` (3:1), both in
truecolor and as a 256-colour terminal (tmux's default) renders the colours.

Textual's themes pick their accent, warning and footer colours for looks, and some fall under 2:1 on a
light background (atom-one-light's warning, catppuccin-latte's footer keys). `readable_variables` nudges
each theme variable that colours text until it stands out from the background it is drawn on; the app
applies it to the CSS variables of whatever theme is chosen. ANSI themes use the terminal's own colours,
which are the terminal's to pick."""

from __future__ import annotations

from rich.color import Color as RichColor
from rich.color import ColorSystem
from rich.style import Style
from textual.color import Color, ColorParseError
from textual.theme import Theme

MIN_CONTRAST = 3.0  # WCAG's minimum for large or bold text; every text style must reach it on every theme

# theme variables that colour text -> the variables of the backgrounds it is drawn on
TEXT_VARIABLES = {
    # solarized-dark's foreground is 2.2:1 on its surface in 256 colours; toasts are on panel-lighten-1
    "foreground": ("background", "surface", "panel", "panel-lighten-1"),
    **{f"text-{kind}": ("background", "surface", "panel-lighten-1") for kind in
       ("primary", "secondary", "accent", "warning", "error", "success")},
    "footer-key-foreground": ("footer-background",),
    "footer-description-foreground": ("footer-background",),
    "footer-foreground": ("footer-background",),
    "block-cursor-foreground": ("block-cursor-background",),  # a table's selected row
}
# $text-muted is "auto 60%" (the text colour at 60% over whatever background): under 3:1 in 256 colours on
# some dark themes
TEXT_MUTED = "auto 72%"


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


def reads_on(colour: Color, background: Color) -> bool:
    """Whether `colour` reaches MIN_CONTRAST on `background`, in truecolor and in 256 colours."""
    return contrast(colour, background) >= MIN_CONTRAST and \
        contrast(in_256_colours(colour), in_256_colours(background)) >= MIN_CONTRAST


def readable(colour: Color, *backgrounds: Color) -> Color:
    """`colour`, moved away from the (first) background's lightness until it reaches MIN_CONTRAST on every
    background, in truecolor and as a 256-colour terminal renders both."""
    dark = backgrounds[0].brightness < 0.5
    for _ in range(40):
        if all(reads_on(colour, background) for background in backgrounds):
            break
        colour = colour.lighten(0.03) if dark else colour.darken(0.03)
    return colour


def theme_background(theme: Theme) -> Color:
    """The colour a theme paints behind text; an ANSI theme's is the terminal's, taken as black or white."""
    background = Color.parse(theme.to_color_system().generate()["background"])
    if background.ansi is not None:
        return Color(0, 0, 0) if theme.dark else Color(255, 255, 255)
    return background


def _solid(value: str, under: Color | None = None) -> Color | None:
    """A variable's colour as painted (a translucent one over `under`); None for "auto" or ANSI colours."""
    try:
        colour = Color.parse(value)
    except ColorParseError:
        return None
    if colour.ansi is not None:
        return None
    return (under + colour) if under is not None and colour.a < 1 else colour.with_alpha(1.0)


def readable_variables(variables: dict[str, str]) -> dict[str, str]:
    """A theme's CSS variables with every text colour nudged to MIN_CONTRAST on the backgrounds it is
    drawn on (see TEXT_VARIABLES); an ANSI theme's are left to the terminal."""
    background = _solid(variables.get("background", ""))
    if background is None:
        return variables
    fixed = {**variables, "text-muted": TEXT_MUTED}
    for name, behind in TEXT_VARIABLES.items():
        backgrounds = [c for c in (_solid(variables.get(b, ""), background) for b in behind) if c is not None]
        if len(backgrounds) < len(behind):
            continue
        colour = _solid(variables.get(name, ""), backgrounds[0])
        if colour is None:
            continue
        if not all(reads_on(colour, b) for b in backgrounds):
            fixed[name] = readable(colour, *backgrounds).hex
    return fixed


# (colour, attributes) per origin, for dark and for light backgrounds. No "dim": it would blend the ghosts
# into the background; the strike-through sets them apart.
PALETTES = {
    True: {"draft": ("#56d364", "bold"), "target": ("#79c0ff", ""), "ghost": ("#f85149", "strike")},
    False: {"draft": ("#1a7f37", "bold"), "target": ("#0550ae", ""), "ghost": ("#cf222e", "strike")},
}


def origin_styles(background: Color) -> dict[str, Style]:
    """The answer's styles for text on `background`: draft, target, ghost and plain."""
    palette = PALETTES[background.brightness < 0.5]
    styles = {kind: Style.parse(f"{attrs} {readable(Color.parse(colour), background).hex}".strip())
              for kind, (colour, attrs) in palette.items()}
    return {**styles, "plain": Style()}
