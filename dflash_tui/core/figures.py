"""Figures as every front end prints them. A figure the engine could not know is None in the Summary
(the remote engine on a server that is not `dflash serve`): it shows as UNKNOWN, never as a measured 0."""

from __future__ import annotations

from typing import Optional

UNKNOWN = "–"  # an en dash


def fixed(value: Optional[float], digits: int = 2) -> str:
    """'6.86', or '–' for an unknown value."""
    return UNKNOWN if value is None else f"{value:.{digits}f}"


def known(value) -> str:
    """str(value), or '–' for an unknown one."""
    return UNKNOWN if value is None else str(value)
