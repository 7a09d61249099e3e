"""What the chat remembers between runs that belongs to no profile or session: the theme.

A small JSON file in the dflash config directory (next to `profiles/`, so `DFLASH_CONFIG_DIR` moves
it too). A preference is a convenience: a missing, corrupt or unwritable file never stops the app;
the caller gets one sentence to show instead.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from dflash_tui.core.profiles import config_dir
from dflash_tui.engines import files

FILE_NAME = "preferences.json"


@dataclass
class Preferences:
    theme: Optional[str] = None  # a Textual theme name; None: Textual's default


def preferences_path() -> Path:
    return config_dir() / FILE_NAME


def load_preferences(path: Optional[Path] = None) -> tuple[Preferences, Optional[str]]:
    """The saved preferences (defaults when there are none) and a warning when the file is unusable."""
    path = path or preferences_path()
    if path.exists() and not path.is_file():  # a FIFO would block the read, a device never end it
        return Preferences(), f"Ignored {path} (not a regular file); the theme is not remembered."
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return Preferences(), None
    except OSError as exc:
        return Preferences(), f"Could not read preferences from {path} ({exc.strerror or exc}); the theme is not remembered."
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return Preferences(), f"Ignored the preferences in {path} ({exc}); delete the file to start afresh."
    if not isinstance(data, dict):
        return Preferences(), f"Ignored the preferences in {path} (not a JSON object); delete the file to start afresh."
    theme = data.get("theme")
    if theme is not None and not isinstance(theme, str):
        return Preferences(), f"Ignored the theme in {path} (not a theme name); pick one again from the palette."
    return Preferences(theme=theme), None


def save_preferences(prefs: Preferences, path: Optional[Path] = None) -> Optional[str]:
    """Write `prefs` whole (a new file renamed over the old one, engines/files.py); a warning when that failed."""
    path = path or preferences_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        files.write_file(path, (json.dumps(asdict(prefs), indent=2) + "\n").encode("utf-8"), mode=None)
    except OSError as exc:
        return f"Could not save preferences to {path} ({exc.strerror or exc}); the theme lasts for this run only."
    return None
