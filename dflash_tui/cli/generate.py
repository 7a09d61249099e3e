"""`dflash generate`: one prompt, streamed and coloured by origin, or `--json` for scripts."""

from __future__ import annotations

import io
import json
import sys
from typing import Optional

import click

from dflash_tui.cli import complete
from dflash_tui.cli.downloads import ensure_local
from dflash_tui.cli.style import ORIGIN_STYLE, color_enabled
from dflash_tui.core.figures import fixed, known
from dflash_tui.core.settings import generation_request, load_settings
from dflash_tui.core.structured import flags_constraint
from dflash_tui.core.terminal import printable
from dflash_tui.engines import load_engine
from dflash_tui.engines.config import EFFORTS
from dflash_tui.engines.engine import EngineLike
from dflash_tui.engines.errors import UserError
from dflash_tui.engines.prompting import chat_ids, check_text, preflight
from dflash_tui.engines.reasoning import THINK, format_for
from dflash_tui.measure.replay import format_bytes


def engine_options(fn):
    """Options every command that loads an engine shares."""
    options = [
        click.option("--profile", "-p", shell_complete=complete.profile_names,
                     help="Profile name or TOML file (default: demo)."),
        click.option("--target", help="Target checkpoint: a directory or a hub id. It replaces the profile's pair: "
                     "the profile's draft and block size go unless --draft names a draft."),
        click.option("--draft", help="DFlash draft checkpoint: a directory or a hub id."),
        click.option("--engine", type=click.Choice(["auto", "cuda", "mlx", "remote"]), help="Engine (default: the profile's, else auto)."),
        click.option("--url", help="Remote engine: an OpenAI-compatible server, http://HOST:PORT/v1 (implies --engine remote)."),
        click.option("--model", help="Remote engine: the served model (default: the first the server lists)."),
        click.option("--api-key", help="Remote engine: the server's API key (default: DFLASH_API_KEY, else OPENAI_API_KEY)."),
        click.option("--device", help="auto (default), cpu, or cuda / cuda:N on the CUDA engine, gpu on MLX."),
        click.option("--dtype", type=click.Choice(["auto", "float32", "float16", "bfloat16"]), help="Weights dtype."),
        click.option("--block-size", "-b", type=int, help="Tokens per verify step, 1 to 64 (1 = plain decoding)."),
        click.option("--draft-window", "--draft-sliding-window-size", "draft_window", type=int,
                     help="The block attends to at most this many recent context positions."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


# The most PROMPT '-' reads from standard input: 8 bytes per token of a 1,048,576-token context, the longest
# any target dflash runs takes (a token is about 4 bytes of text), so a prompt that could fit is never cut,
# and an endless stream (`< /dev/zero`) costs at most this much memory before it is refused.
STDIN_LIMIT = 8 * 2**20


def read_stdin(limit: Optional[int] = None) -> str:
    """The prompt piped in for PROMPT '-', at most `limit` bytes (STDIN_LIMIT): one sentence when standard input
    is closed, longer than that, or not UTF-8. Never reads more than `limit` + 1 bytes."""
    limit = STDIN_LIMIT if limit is None else limit
    stream = sys.stdin
    if stream is None:  # started with stdin closed (`<&-`)
        raise UserError("PROMPT is '-' but standard input is closed; pipe the prompt in, or pass it as an argument.")
    source = stream.buffer if isinstance(stream, io.TextIOWrapper) else stream  # a StringIO put in its place has none
    try:
        data = source.read(limit + 1)  # a buffered read: until limit + 1 bytes (characters) or the end
    except (OSError, ValueError) as exc:  # a closed or unreadable descriptor
        raise UserError(f"PROMPT is '-' but standard input cannot be read ({printable(exc)}); pipe the prompt in, "
                        "or pass it as an argument.") from None
    if len(data) > limit:
        raise UserError(f"Standard input holds more than {limit:,} bytes, the most a prompt may be (8 bytes per token "
                        "of a million-token context); send a shorter prompt.")
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"Standard input is not valid UTF-8 (byte {exc.start} of {len(data)}); convert the prompt "
                        "to UTF-8, e.g. with iconv.") from None


def stats_line(summary) -> str:
    """The figures after an answer; one the engine could not know (a foreign server's) reads "–"."""
    peak = format_bytes(summary.peak_memory_bytes)
    if summary.peak_memory_kind == "process-lifetime-rss":
        peak += " (process peak RSS)"
    # a remote server names its own engine, device and dtype: its words are escaped like any outside text
    return printable(f"{summary.generated_tokens} tokens · {summary.decode_tokens_per_s:.1f} tok/s · "
                     f"tau {fixed(summary.mean_acceptance_length)} · peak {peak} · block {known(summary.block_size)} · "
                     f"{summary.engine} engine on {summary.device} · {summary.dtype} · "
                     f"{summary.stopped_by or summary.finish_reason}")


class AnswerFilter:
    """Streams only the answer of a thinking model: pieces are held while the reasoning trace may still
    be running, and released from where the answer starts (all of them if no trace ever closes)."""

    def __init__(self, thinking: bool, fmt=THINK):
        self.thinking = thinking
        self.fmt = fmt  # the family's thinking format (engines/reasoning.py)
        self.raw = ""
        self.pieces: list[tuple[int, str, str]] = []  # (offset, text, origin)
        self.printed = 0

    def add(self, pieces, final: bool) -> list[tuple[str, str]]:
        for text, origin in pieces:
            self.pieces.append((len(self.raw), text, origin))
            self.raw += text
        start, end, answer = self.fmt.layout(self.raw, self.thinking)
        if not final and (end == len(self.raw) or (self.thinking and not self.fmt.thought(self.raw))):
            return []  # still (maybe) inside the trace
        begin = max(answer, self.printed)
        out = [(text[max(begin - at, 0):], origin) for at, text, origin in self.pieces if at + len(text) > begin]
        self.printed = len(self.raw)
        return [(text, origin) for text, origin in out if text]


def with_tools(loaded: EngineLike, request, tools):
    """The request's messages rendered with `tools` by the target's template (as `dflash serve` does)."""
    import dataclasses

    from dflash_tui.serve.tools import tool_format

    tokenizer = loaded.tokenizer
    if tokenizer is None:
        raise UserError("--tools needs the target's tokenizer here; on a server, send tools through its API.")
    fmt = tool_format(tokenizer)
    if fmt is None:
        raise UserError("The target's chat template has no tools branch, so --tools cannot be used with it.")
    ids = chat_ids(tokenizer, request.messages, request.thinking, request.reasoning_effort, tools)
    return dataclasses.replace(request, messages=None, prompt_ids=ids), fmt


def tool_calls(text: str, thinking: bool, fmt: str, layout=THINK) -> list[dict]:
    """The OpenAI tool calls in an answer (its reasoning trace left out; harmony's parser reads the whole
    reply, whose calls are messages of their own)."""
    from dflash_tui.serve.tools import parse_text, parser_for, wire_call

    _, _, answer = layout.layout(text, thinking)
    _, calls = parse_text(fmt, text if parser_for(fmt).raw else text[answer:])
    return [{k: v for k, v in wire_call(c, i).items() if k != "index"} for i, c in enumerate(calls)]


@click.command()
@click.argument("prompt")
@engine_options
@click.option("--max-new-tokens", "-n", type=int, help="Most tokens to generate (default: the profile's).")
@click.option("--temperature", "-t", type=float, help="0 = greedy (default: the profile's, else generation_config).")
@click.option("--top-p", type=float, help="Nucleus sampling: keep the likeliest tokens up to this total probability, "
              "above 0 and at most 1 (default: the profile's, else the target's generation_config).")
@click.option("--top-k", type=int, help="Sample among the K likeliest tokens; 0 = off (default: the profile's, else "
              "the target's generation_config).")
@click.option("--min-p", type=float, help="Drop tokens less likely than this fraction of the top token's probability, "
              "0 to 1 (default: the profile's, else the target's generation_config).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--thinking/--no-thinking", default=None, help="enable_thinking for the chat template.")
@click.option("--reasoning-effort", type=click.Choice(EFFORTS),
              help="How long a model with an effort level thinks (gpt-oss; default: the profile's, else medium).")
@click.option("--system", help="System prompt (default: the profile's).")
@click.option("--raw", is_flag=True, help="Send PROMPT as plain text: no chat template, no special tokens.")
@click.option("--hide-thinking", is_flag=True, help="Print only the answer, not the reasoning trace before it.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per step, then the summary.")
@click.option("--tools", "tools_file", metavar="FILE.json",
              help="OpenAI tools (a JSON list) for the chat template; the tool calls in the answer are printed as JSON.")
@click.option("--json-schema", metavar="FILE.json",
              help="Constrain the answer to JSON matching this schema (after the reasoning when thinking is on).")
@click.option("--regex", metavar="PATTERN", help="Constrain the answer to match this regular expression, whole.")
@click.option("--choice", metavar="A,B,...", help="Constrain the answer to exactly one of these comma-separated strings.")
def generate(prompt, profile, target, draft, engine, url, model, api_key, device, dtype, block_size, draft_window, max_new_tokens,
             temperature, top_p, top_k, min_p, seed, thinking, reasoning_effort, system, raw, hide_thinking, as_json,
             tools_file, json_schema, regex, choice):
    """Generate an answer to PROMPT ('-' reads standard input).

    On a terminal the text streams coloured by origin: green tokens were drafted and accepted,
    plain ones the target wrote itself. A stats line follows on stderr.
    """
    if prompt == "-":
        prompt = read_stdin()
    check_text(prompt)  # lone surrogates (undecodable argv bytes) are refused before anything loads
    check_text(system)
    if not prompt:
        raise UserError("The prompt is empty; give the text to send, or '-' to read it from standard input.")
    for flag, given in (("--system", system is not None), ("--tools", tools_file is not None)):
        if raw and given:
            raise UserError(f"{flag} goes through the chat template, which --raw leaves out; drop one of them.")
    settings, config = load_settings(profile, engine or ("remote" if url else None), target, draft, device=device,
                                     dtype=dtype, block_size=block_size, draft_window=draft_window, url=url,
                                     model=model, api_key=api_key)
    if raw:
        content = {"prompt": prompt}
    else:
        system = settings.system_prompt if system is None else system
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        content = {"messages": messages}
    constraint = flags_constraint(json_schema, regex, choice)  # checked before anything loads
    request = generation_request(settings, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                 top_k=top_k, min_p=min_p, seed=seed, thinking=thinking,
                                 reasoning_effort=reasoning_effort, constraint=constraint, **content)
    ensure_local(config)
    preflight(config, [request])  # the prompt, its template and the context, before any weight loads
    tools = None
    if tools_file:
        from dflash_tui.serve.tools import load_tools_file

        tools = load_tools_file(tools_file)
    loaded = load_engine(config)
    for warning in loaded.warnings:
        click.echo(printable(f"note: {warning}"), err=True)
    tool_fmt = None
    if tools:
        request, tool_fmt = with_tools(loaded, request, tools)
    colour = color_enabled()
    layout = format_for(loaded)
    shown = AnswerFilter(request.thinking, layout) if hide_thinking else None
    for event in loaded.generate(request):
        if as_json:
            click.echo(json.dumps({"event": "step", **event.to_dict()}))
            continue
        pieces = shown.add(event.pieces, final=event.finish_reason is not None) if shown else event.pieces
        for text, origin in pieces:
            text = printable(text)  # model output: no escape sequence reaches the terminal
            click.echo(click.style(text, **ORIGIN_STYLE[origin]) if colour else text, nl=False)
        sys.stdout.flush()
    summary = loaded.last_summary
    calls = tool_calls(summary.text, request.thinking, tool_fmt, layout) if tools else None
    if as_json:
        if calls is not None:
            click.echo(json.dumps({"event": "tool_calls", "tool_calls": calls}))
        click.echo(json.dumps({"event": "summary", **summary.to_dict()}))
    else:
        click.echo()
        for call in calls or []:
            click.echo(printable(json.dumps(call, ensure_ascii=False)))
        if calls is not None:
            click.echo(f"{len(calls)} tool call{'' if len(calls) == 1 else 's'} parsed", err=True)
        click.echo(stats_line(summary), err=True)
