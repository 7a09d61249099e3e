"""Shell completion of profile names and session ids (click's completion: `dflash --help` shows how
to enable it; see README, "Shell completion")."""

from __future__ import annotations

from click.shell_completion import CompletionItem


def profile_names(ctx, param, incomplete: str) -> list[CompletionItem]:
    from dflash_tui.core import profiles

    return [CompletionItem(p.name, help=p.description) for p in profiles.list_profiles(errors=[])
            if p.name.startswith(incomplete)]


def session_ids(ctx, param, incomplete: str) -> list[CompletionItem]:
    from dflash_tui.core import sessions

    return [CompletionItem(s.id, help=s.title[:60]) for s in sessions.list_sessions(skipped=[])
            if s.id.startswith(incomplete)]
