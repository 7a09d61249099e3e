"""`dflash chat` (the TUI, or the plain REPL) and `dflash sessions` (list, show, export, delete)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional, Union

import click

from dflash_tui.cli import complete
from dflash_tui.cli.downloads import ensure_local
from dflash_tui.core import sessions as store
from dflash_tui.core.profiles import Profile
from dflash_tui.core.settings import with_pair
from dflash_tui.core.terminal import json_text, printable
from dflash_tui.engines.config import EFFORTS
from dflash_tui.engines.errors import UserError


def profile_from_session(session: store.Session) -> Union[str, Profile, None]:
    """The profile a recorded session ran with: its file, else its name. A chat started with
    `--target/--draft` had no profile file: it resumes with that pair again (the paths the engine loaded)."""
    profile = session.header.get("profile") or {}
    path = profile.get("path")
    if path and os.path.isfile(str(path)):
        return str(path)
    header = session.header
    target = header.get("target_path") or header.get("target")
    if path is None and target:
        return with_pair(None, target, header.get("draft_path") or header.get("draft"))
    return profile.get("name") or None


def with_last_draft(profile: Union[str, Profile, None], session: store.Session) -> Union[str, Profile, None]:
    """`profile` running the draft the session's last turn ran, where that is one of the drafts it lists (the
    palette may have switched to it); else `profile` as it is."""
    used = session.last_settings().get("draft")
    if not used or profile is None:
        return profile
    from dflash_tui.core.settings import profile_for

    loaded = profile_for(profile)
    for draft in loaded.drafts[1:]:
        if used in (draft, loaded.local_path(draft)):
            return loaded.with_draft(draft)
    return profile


LAST = ""  # `--resume` without an id


def last_session() -> store.Session:
    """The session used last (the picker's first row): `--continue`, and `--resume` without an id."""
    found = store.list_sessions()
    if not found:
        raise UserError(printable(f"No session to continue in {store.sessions_dir()} yet; `dflash chat` starts one."))
    return store.by_last_use(found)[0]


@click.command()
@click.option("--profile", "-p", "profile", metavar="NAME|PATH", shell_complete=complete.profile_names,
              help="A profile name or TOML file (default: demo).")
@click.option("--target", help="Target checkpoint: a directory or a hub id (overrides the profile's).")
@click.option("--draft", help="DFlash draft checkpoint: a directory or a hub id.")
@click.option("--engine", type=click.Choice(["auto", "cuda", "mlx", "remote"]), default=None,
              help="Engine (default: the profile's, else auto).")
@click.option("--url", help="Remote engine: an OpenAI-compatible server, http://HOST:PORT/v1 (implies --engine remote).")
@click.option("--model", help="Remote engine: the served model (default: the first the server lists).")
@click.option("--api-key", help="Remote engine: the server's API key (default: DFLASH_API_KEY, else OPENAI_API_KEY).")
@click.option("--block-size", type=int, default=None, help="Block size (1 = plain decoding; default: the profile's).")
@click.option("--thinking/--no-thinking", default=None, help="Thinking for the first turn (ctrl+t toggles it).")
@click.option("--reasoning-effort", type=click.Choice(EFFORTS), default=None,
              help="How long a model with an effort level thinks (gpt-oss; ctrl+t cycles it; default: the profile's).")
@click.option("--resume", "resume_id", metavar="[ID]", is_flag=False, flag_value=LAST, default=None,
              shell_complete=complete.session_ids,
              help="Continue a recorded session (`dflash sessions list`); without an ID, the last one used.")
@click.option("--continue", "-c", "continue_last", is_flag=True, help="Continue the last session used.")
@click.option("--plain", is_flag=True, help="The plain prompt-toolkit REPL instead of the full-screen TUI.")
@click.option("--max-new-tokens", type=int, default=None, help="Answer length cap (default: the profile's).")
def chat(profile, target, draft, engine, url, model, api_key, block_size, thinking, reasoning_effort, resume_id,
         continue_last, plain, max_new_tokens) -> None:
    """Chat with a target and its DFlash draft; drafted tokens are coloured as they stream.

    Keys: enter send, ctrl+j newline, ctrl+t thinking (gpt-oss: its effort), ctrl+g ghosts, f7 block size,
    escape stop, ctrl+n new session, ctrl+o sessions, ctrl+r replay, ctrl+p palette, f1 help, ctrl+q quit.
    Every turn is saved as it completes (`dflash sessions list`); `dflash chat -c` continues the last session.
    """
    if max_new_tokens is not None and max_new_tokens < 1:
        raise UserError(f"--max-new-tokens {max_new_tokens} must be a positive number of tokens.")
    if continue_last and resume_id:
        raise UserError("--continue resumes the last session; --resume ID names one: give one of them.")
    session: Optional[store.Session]
    if continue_last or resume_id == LAST:
        session = last_session()
    else:
        session = store.load_session(resume_id) if resume_id is not None else None
    if session is not None:
        # the lock first, before any weight loads (a `sessions delete` meanwhile is refused), then the file read
        # again under it; a file that is not one of dflash's own is copied in and the copy continued
        session, note = store.open_to_resume(session)
        if note:
            click.echo(printable(f"note: {note}"), err=True)
        if profile is None:
            profile = with_last_draft(profile_from_session(session), session)
        recorded = session.header.get("profile") or {}
        if session.header.get("engine") == "remote" and engine is None and url is None:
            # its server, not the local pair the profile names (a remote chat loaded nothing here)
            engine, url, model = "remote", recorded.get("url"), model or recorded.get("model")
    from dflash_tui.core.settings import profile_for, with_remote

    if target or draft:
        profile = with_pair(profile, target, draft)
    if url or model or api_key:
        profile, engine = with_remote(profile_for(profile), url, model, api_key), engine or "remote"
    # every flag is checked, and the pair is on disk, before any weight loads (a bad block size is
    # one sentence here, not after the model is up)
    ensure_local(profile_for(profile).engine_config(engine, block_size=block_size))
    if plain or not sys.stdin.isatty() or not sys.stdout.isatty():
        from dflash_tui.repl import run_repl

        sys.exit(run_repl(profile, engine, block_size, thinking, session, max_new_tokens,
                          reasoning_effort=reasoning_effort))
    from dflash_tui.tui.app import DflashApp

    # Textual sizes the screen with shutil.get_terminal_size, which believes COLUMNS and LINES over the
    # terminal: a stale pair exported by a shell (tmux panes resized at start do this) would pin the
    # app at that size and make it ignore every resize. The terminal itself is the truth here.
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)
    app = DflashApp(profile=profile, engine=engine, block_size=block_size, thinking=thinking, resume=session,
                    max_new_tokens=max_new_tokens, reasoning_effort=reasoning_effort)
    app.run()
    writer = app.conversation.writer if app.conversation is not None else None
    if writer is not None:
        click.echo(printable(writer.farewell()))
    if app.loading:
        # A load still running in its thread would hold the exit until it finishes; nothing is unsaved.
        sys.stdout.flush()
        os._exit(0)
    if app.return_code:
        sys.exit(app.return_code)


@click.group("sessions")
def sessions_group() -> None:
    """Recorded chat sessions: list, show, rename, export, delete."""


@sessions_group.command("list")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON document: an array with an object per session (id, created, profile, turns, "
                   "engine, title, path), newest first.")
def sessions_list(as_json: bool) -> None:
    """Sessions, newest first (a damaged file is skipped with a warning naming it)."""
    skipped: list[UserError] = []
    found = store.list_sessions(skipped)
    for problem in skipped:
        click.echo(printable(f"skipped: {problem}"), err=True)
    if as_json:
        rows = [{"id": s.id, "created": s.created, "profile": s.profile_name, "turns": len(s.turns),
                 "engine": s.header.get("engine"), "title": s.title, "path": str(s.path)} for s in found]
        click.echo(json_text(rows, indent=2))
        return
    if not found:
        click.echo(printable(f"No sessions yet in {store.sessions_dir()}."))
        return
    for row in store.listing(found):
        click.echo(row)


@sessions_group.command("show")
@click.argument("session_id", metavar="ID", shell_complete=complete.session_ids)
def sessions_show(session_id: str) -> None:
    """A session's turns as Markdown, with its figures."""
    session = store.load_session(session_id)
    for warning in session.warnings:
        click.echo(printable(f"warning: {warning}"), err=True)
    click.echo(printable(store.to_markdown(session)))


@sessions_group.command("rename")
@click.argument("session_id", metavar="ID", shell_complete=complete.session_ids)
@click.argument("title", nargs=-1)
def sessions_rename(session_id: str, title: tuple[str, ...]) -> None:
    """Give a session a TITLE (none: clear it, and its first prompt shows again); not while a dflash has it open."""
    session = store.load_session(session_id)
    click.echo(printable(f"{session.id}: {store.renamed(store.rename_session(session, ' '.join(title)))}"))


@sessions_group.command("export")
@click.argument("session_id", metavar="ID", shell_complete=complete.session_ids)
@click.option("--format", "fmt", type=click.Choice(store.EXPORT_FORMATS), default="md", show_default=True)
@click.option("--output", "-o", type=click.Path(dir_okay=False), help="Write here (mode 0600) instead of stdout.")
def sessions_export(session_id: str, fmt: str, output: Optional[str]) -> None:
    """Export a session as Markdown or JSON."""
    session = store.load_session(session_id)
    for warning in session.warnings:
        click.echo(printable(f"warning: {warning}"), err=True)
    if output:  # the file gets the session as recorded
        store.export_session(session, fmt, Path(output))
        click.echo(printable(f"Wrote {output}."), err=True)
    else:  # standard output may be a terminal, or a pipe into one: escaped (JSON with \u escapes, still exact)
        click.echo(printable(store.to_markdown(session)) if fmt == "md" else json_text(store.to_json(session), indent=2))


@sessions_group.command("delete")
@click.argument("session_id", metavar="ID", shell_complete=complete.session_ids)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation (for scripts).")
def sessions_delete(session_id: str, yes: bool) -> None:
    """Delete a session file and its replay comparisons (asks first; only files in the sessions folder)."""
    session = store.resolve_own(session_id)
    store.refuse_if_open(session)  # before asking, not after
    what = store.deletion_text(session)
    if not yes:
        try:
            confirmed = click.confirm(printable(f"Delete {what}?"), default=False, err=True)
        except click.Abort:  # stdin ended before an answer (a script)
            click.echo(err=True)
            raise UserError(printable(f"Deleting {what} needs confirmation; answer at a terminal or pass --yes.")) from None
        if not confirmed:
            click.echo("Nothing deleted.")
            return
    store.delete_session(session)
    click.echo(printable(f"Deleted {what}."))


sessions = sessions_group  # `main.add_command(sessions)`
