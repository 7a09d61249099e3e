"""`dflash serve` and `dflash profile serve-command` (registered in dflash_tui.cli)."""

from __future__ import annotations

import re
from typing import Any, Optional

import click

from dflash_tui.engines.errors import UserError
from dflash_tui.engines.text import printable

ENGINE_CHOICES = ["auto", "cuda", "mlx"]


def require_serve_extra() -> None:
    """starlette and uvicorn come with the [serve] extra only: without them, one sentence and exit 2."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise UserError(f"`dflash serve` needs the serve extra ({exc.name or 'starlette'} is not installed): "
                        "pip install 'dflash-tui[serve]'") from None


class ByteSize(click.ParamType):
    """--max-body: '8MB', '512KB', '1.5G', '1000000' bytes (K, M and G are 1024-based; a trailing B or iB is
    optional), from 1 byte to 1 GB. Plain decimal digits only: no exponent, no inf or nan, no overflow."""

    name = "size"
    PATTERN = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?)(?:I?B)?\s*", re.I)
    SCALE = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}
    LOW, HIGH = 1, 2**30

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            size: float = value
        else:
            found = self.PATTERN.fullmatch(str(value))
            if found is None:
                self.fail(f"{str(value)[:40]!r} is not a size; pass bytes or a size such as 8MB.", param, ctx)
            size = float(found.group(1)) * self.SCALE[found.group(2).upper()]  # 400 digits: inf, refused below
        if not self.LOW <= size <= self.HIGH:
            self.fail(f"{str(value)[:40]!r} is not a size from 1 byte to 1 GB.", param, ctx)
        return int(size)


def _settings(profile: Optional[str], engine: Optional[str], block_size: Optional[int]):
    from dflash_tui.core.settings import load_settings

    return load_settings(profile, engine, block_size=block_size)


@click.command()
@click.option("--profile", "-p", metavar="NAME|PATH", help="A profile name or TOML file (default: demo).")
@click.option("--engine", type=click.Choice(ENGINE_CHOICES), default=None, help="Engine (default: the profile's, else auto).")
@click.option("--block-size", "-b", type=int, default=None,
              help="Default block size (requests may choose their own through the dflash extension field).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; beyond loopback an API key is required.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@click.option("--api-key", envvar="DFLASH_API_KEY", default=None,
              help="Require 'Authorization: Bearer KEY' on every route but /health (env: DFLASH_API_KEY).")
@click.option("--max-queue", default=64, show_default=True, type=click.IntRange(1, 100_000),
              help="Requests that may wait for the engine; one more gets HTTP 429 with Retry-After.")
@click.option("--reasoning-split/--no-reasoning-split", default=True, show_default=True,
              help="Thinking in reasoning_content and reasoning (split), or inline <think> text in content.")
@click.option("--served-model-name", "names", multiple=True, metavar="NAME",
              help="Model name(s) clients send (default: the profile's name, and its target).")
@click.option("--max-body", default="8MB", show_default=True, metavar="SIZE", type=ByteSize(),
              help="The largest request body (bytes, or with KB/MB/GB; at most 1 GB); a larger one gets HTTP 413.")
@click.option("--clamp-max-tokens", is_flag=True,
              help="Cut a max_tokens beyond the context to what fits, instead of vLLM's 400.")
@click.option("--allowed-origins", default=None, metavar="ORIGINS",
              help="Comma-separated origins browsers may call from (CORS; off by default), or '*'.")
@click.option("--allowed-hosts", default=None, metavar="HOSTS",
              help="Comma-separated host names clients may reach this server by, beyond the --host address and "
                   "loopback (localhost, 127.0.0.1, ::1), or '*' for any; a request for another Host gets HTTP 403 "
                   "(a web page reaching a loopback server through DNS rebinding).")
@click.option("--shutdown-grace", default=3.0, show_default=True, type=click.FloatRange(0, 3600),
              help="Seconds running answers may go on after SIGTERM before they end with an error.")
@click.option("--prefix-reuse/--no-prefix-reuse", default=True, show_default=True,
              help="Start each request from the caches the previous one left, where its ids share a prefix "
                   "(one prefix is kept: the most recent request's).")
def serve(profile, engine, block_size, host, port, api_key, max_queue, reasoning_split, names, max_body,
          clamp_max_tokens, allowed_origins, allowed_hosts, shutdown_grace, prefix_reuse) -> None:
    """Serve a profile's pair over the OpenAI API: /v1/chat/completions, /v1/completions, /v1/models,
    /tokenize, /metrics and /health.

    The pair loads once, in the engine process, and answers one request at a time; others wait in a
    queue of --max-queue. The caches of the most recent request are kept: a request that resends its
    conversation prefills only what is new (usage.prompt_tokens_details.cached_tokens says how much
    was reused); interleaved clients share that one prefix, so a client whose turn follows another's
    prefills its whole prompt.
    Each streamed chunk carries the DFlash step (drafted, accepted, origins) in a `dflash` field that
    standard clients ignore; `dflash chat --engine remote --url http://HOST:PORT/v1` shows it all.
    """
    require_serve_extra()
    body_limit = max_body  # bytes: ByteSize read it
    if any(not n.strip() for n in names):
        raise UserError("--served-model-name '' is empty; give each name clients send, such as demo.")
    origins = tuple(o.strip() for o in (allowed_origins or "").split(",") if o.strip())
    hosts = tuple(h.strip() for h in (allowed_hosts or "").split(",") if h.strip())
    from .run import check_host, check_port, exit_now
    from .run import serve as run_server

    check_host(host, api_key)  # both before any weight loads
    check_port(host, port)
    settings, config = _settings(profile, engine, block_size)
    from dflash_tui.cli.downloads import ensure_local

    ensure_local(config)  # a pair not yet downloaded: its size and a question at a terminal, else one sentence
    defaults = {"max_new_tokens": settings.max_new_tokens, **settings.sampling(), "thinking": settings.thinking,
                "reasoning_effort": settings.reasoning_effort}
    from .app import public_name

    # a local target is served under its folder's name, never its path (/v1/models and every 404 list these)
    served = list(names) or list(dict.fromkeys(n for n in (settings.name, public_name(settings.target)) if n))
    run_server(config, served, defaults, host=host, port=port, api_key=api_key, max_queue=max_queue,
               reasoning_split=reasoning_split, say=lambda text: click.echo(printable(text), err=True),
               max_body=body_limit, clamp_max_tokens=clamp_max_tokens, allowed_origins=origins,
               shutdown_grace=shutdown_grace, prefix_reuse=prefix_reuse, allowed_hosts=hosts)
    exit_now()  # stopped (SIGTERM, ctrl+c), its engine process gone: no slow interpreter teardown



@click.command("serve-command")
@click.argument("name")
@click.option("--for", "server", type=click.Choice(["vllm", "sglang"]), required=True, help="The server to launch.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(1, 65535), default=None, help="Default: 8000 for vLLM, 30000 for SGLang.")
def serve_command(name: str, server: str, host: str, port: Optional[int]) -> None:
    """Print the vLLM or SGLang launch command for profile NAME's pair (then chat with it through
    `dflash chat --engine remote --url http://HOST:PORT/v1`)."""
    from dflash_tui.core.profiles import load_profile

    from .launch import DEFAULT_PORTS
    from .launch import serve_command as build

    line, notes = build(load_profile(name), server, host, port)
    click.echo(printable(line))
    for note in notes:
        click.echo(printable(f"note: {note}"), err=True)
    shown = DEFAULT_PORTS[server] if port is None else port
    click.echo(printable(f"then: dflash chat --engine remote --url http://{host}:{shown}/v1"), err=True)
