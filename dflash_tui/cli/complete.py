"""Shell completion of profile names and session ids (click's completion: `dflash --help` shows how
to enable it; see README, "Shell completion").

A candidate and its description come from files a user or a checkpoint controls (a session's first
prompt, a profile's description): both pass through `one_line` (core/terminal.py), the same escaping as
every other printer, so no control character, escape sequence or bidirectional override reaches the shell
or the terminal, and no line break splits click's completion protocol."""

from __future__ import annotations

from click.shell_completion import CompletionItem

from dflash_tui.core.terminal import one_line


def item(value: str, description: str) -> CompletionItem:
    """A completion candidate whose value and description are shown escaped, on one line."""
    return CompletionItem(one_line(value), help=one_line(description) or None)


def profile_names(ctx, param, incomplete: str) -> list[CompletionItem]:
    from dflash_tui.core import profiles

    return [item(p.name, p.description) for p in profiles.list_profiles(errors=[])
            if p.name.startswith(incomplete)]


def session_ids(ctx, param, incomplete: str) -> list[CompletionItem]:
    from dflash_tui.core import sessions

    return [item(s.id, s.title[:60]) for s in sessions.list_sessions(skipped=[])
            if s.id.startswith(incomplete)]
