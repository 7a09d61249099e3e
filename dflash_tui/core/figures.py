"""Figures as every front end prints them. A figure the engine could not know is None in the Summary
(the remote engine on a server that is not `dflash serve`): it shows as UNKNOWN, never as a measured 0."""

from __future__ import annotations

import os
from typing import Optional

UNKNOWN = "–"  # an en dash


def fixed(value: Optional[float], digits: int = 2) -> str:
    """'6.86', or '–' for an unknown value."""
    return UNKNOWN if value is None else f"{value:.{digits}f}"


def known(value) -> str:
    """str(value), or '–' for an unknown one."""
    return UNKNOWN if value is None else str(value)


DRAFT_KINDS = {"dflash": "DFlash 1", "dflash2": "DFlash 2"}  # a draft config's architecture, as people say it


def draft_kind(arch: Optional[str]) -> Optional[str]:
    """'DFlash 1' or 'DFlash 2' for a draft's architecture ('dflash', 'dflash2'); None when it is not known
    (a session or a replay written before it was recorded, a server that does not say)."""
    return DRAFT_KINDS.get(arch) if arch else None


def draft_name(value: Optional[str]) -> Optional[str]:
    """A draft as a person reads it: a hub id as it is, a folder by its last name (the demo's `draft2`)."""
    if not value:
        return None
    text = str(value).rstrip("/\\")
    if "/" in text and not text.startswith((".", "/", "~")) and text.count("/") == 1 and not os.path.isdir(text):
        return text  # owner/name: a hub id
    return os.path.basename(text) or text


def draft_text(value: Optional[str], arch: Optional[str]) -> str:
    """'draft2 (DFlash 2)'; 'no draft' without one; the name alone when its kind is not known."""
    name = draft_name(value)
    if name is None:
        return "no draft"
    kind = draft_kind(arch)
    return f"{name} ({kind})" if kind else name
