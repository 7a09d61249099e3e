"""`dflash replay`, `dflash bench` and `dflash tune`: one engine, several block sizes, one table."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import click

from dflash_tui.cli.generate import engine_options
from dflash_tui.cli.style import color_enabled, console
from dflash_tui.core import sessions as store
from dflash_tui.core.terminal import json_text, printable
from dflash_tui.engines import UserError, files, load_engine
from dflash_tui.engines.prompting import preflight
from dflash_tui.measure import bench as bench_mod
from dflash_tui.measure import replay as replay_mod
from dflash_tui.measure.report import times


class Progress:
    """Runs done of all, on stderr: on a terminal a rich bar redrawn in place and cleared at the end (as
    downloads' and training's); elsewhere (a pipe, a log) one plain line per new label, so a log says
    where a long run is."""

    def __init__(self):
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn
        from rich.progress import Progress as Bar

        self.console = console(err=True)
        self.bar = Bar(BarColumn(bar_width=24), MofNCompleteColumn(), TextColumn("{task.description}", markup=False),
                       console=self.console, transient=True, disable=not self.console.is_terminal)
        self.task: Optional[int] = None
        self.last = ""

    def __call__(self, done: int, total: int, label: str) -> None:
        if self.bar.disable:
            if label != self.last:
                self.console.print(f"{done}/{total} {label}", markup=False, highlight=False)
        elif self.task is None:
            self.bar.start()
            self.task = self.bar.add_task(label, total=total, completed=done)
        else:
            self.bar.update(self.task, completed=done, total=total, description=label, refresh=True)
        self.last = label

    def close(self) -> None:
        self.bar.stop()


repeats_option = click.option(
    "--repeats", "-r", type=int, default=replay_mod.DEFAULT_REPEATS, show_default=True,
    help="Runs per block size after a warm-up; the table shows the best and the spread between them.")


def _width() -> int:
    import shutil

    return max(60, min(shutil.get_terminal_size((100, 24)).columns, 120))


@click.command(epilog=replay_mod.JSON_SCHEMA_HELP)
@click.argument("session_id", metavar="ID")
@click.option("--block-sizes", "-B", default="1,2,4,8,16", show_default=True,
              help="Comma-separated block sizes, 1 to 64 (block 1 is always run: the speedup baseline).")
@click.option("--engine", type=click.Choice(["auto", "cuda", "mlx"]),
              help="Engine (default: the recorded one; another engine uses the profile's override for it).")
@click.option("--device", help="Torch device for the CUDA engine: auto, cpu, cuda, cuda:N.")
@click.option("--dtype", type=click.Choice(["auto", "float32", "float16", "bfloat16"]),
              help="Weights dtype (default: the recorded one).")
@click.option("--temperature", "-t", type=float,
              help="Override the recorded temperature (0 compares outputs token for token).")
@repeats_option
@click.option("--no-save", is_flag=True, help="Do not save the comparison next to the session.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON (schema below).")
def replay(session_id, block_sizes, engine, device, dtype, temperature, repeats, no_save, as_json):
    """Re-run every completed turn of session ID at every block size and compare.

    Every block size gets the recorded prompt ids (history included), a warm-up generation, then
    --repeats runs of every turn. The table shows, per block size, at temperature 0 whether the output
    is identical to the recording and across block sizes (✓; every run is checked), the best decode
    tok/s of the runs and their spread, speedup vs block 1, tau (mean acceptance length), the
    acceptance histogram (lengths 1..B), time to first token and peak memory; where an output differs,
    where it first differs and the target's top-2 logit margin there. A replay on a target other than
    the recorded one (e.g. a quantized MLX build) says "different target". The comparison is saved next
    to the session as `<session>.replay-<time>.json` (schema below); --json prints it. Progress goes to
    stderr.
    """
    from dflash_tui.core import sessions
    from dflash_tui.core.settings import server_text
    from dflash_tui.measure.runs import check_repeats

    check_repeats(repeats)
    sizes = replay_mod.parse_block_sizes(block_sizes)
    session = sessions.load_session(session_id)
    for warning in session.warnings:
        click.echo(printable(f"warning: {warning}"), err=True)
    session.warnings = []
    turns = replay_mod.recorded_turns(session)  # fail before loading anything when nothing can be replayed
    config = replay_mod.engine_config_for(session, engine, device, dtype)
    server = server_text(config)  # the remote engine loads nothing here
    if not server:  # the recorded ids fit this target and its context: checked before any weight loads
        preflight(config, [turn.request(1, temperature) for turn in turns])
    click.echo(printable(f"connecting to {server} ..." if server else
                         f"loading {config.target} on the {config.engine} engine ..."), err=True)
    comparison = _with_progress(replay_mod.run_replay, _load(config), session, sizes, temperature=temperature,
                                repeats=repeats)
    for warning in comparison["warnings"]:
        click.echo(printable(f"note: {warning}"), err=True)
    if as_json:
        click.echo(json_text(comparison.to_dict()))
    else:
        click.echo(replay_mod.report(comparison, color_enabled(), _width()))
    if not no_save:  # after the report: a folder that cannot take the file does not lose what was measured
        path = replay_mod.save_comparison(comparison, session.path)
        click.echo(printable(f"saved {path}"), err=True)
    _exit_on_differences(comparison)


# A greedy choice whose top-2 logits are closer than this may flip between a block verify and a
# 1-token decode in half precision (different reduction order): reported, not failed.
HALF_PRECISION_NOISE = 0.1


def _exit_on_differences(comparison) -> None:
    """Exit 1, saying where, when outputs differ at temperature 0 - unless every difference is a
    near-tie of a half-precision run, which is reported instead."""
    differences = comparison["differences"]
    if not differences:
        return
    half = comparison["dtype"] in ("bfloat16", "float16")
    if half and all(d["margin"] is not None and d["margin"] <= HALF_PRECISION_NOISE for d in differences):
        click.echo(f"note: outputs differ only at near-ties (top-2 margin <= {HALF_PRECISION_NOISE}) in "
                   f"{comparison['dtype']}, where a block verify and a 1-token step may round differently.", err=True)
        return
    d = differences[0]
    click.echo(f"error: outputs differ: turn {d['turn']} at block {d['block_size']} first differs from the "
               f"{d['against']} at token {d['position']} (expected {d['expected']}, got {d['got']}).", err=True)
    sys.exit(1)


def _load(config):
    """The engine, its loading notes on stderr."""
    loaded = load_engine(config)
    for warning in loaded.warnings:
        click.echo(printable(f"note: {warning}"), err=True)
    return loaded


def _with_progress(run, *args, **kwargs):
    """`run(*args, progress=..., **kwargs)` with a progress bar on stderr."""
    progress = Progress()
    try:
        return run(*args, progress=progress, **kwargs)
    finally:
        progress.close()


def measure_options(block_sizes_help: str, max_samples: Optional[int], max_samples_help: str, *between):
    """The options bench and tune share: the engine's, the prompt set, block sizes (then `between`), samples
    and tokens per turn."""
    options = [
        engine_options,
        click.option("--dataset", "-d", default=None,
                     help="Built-in prompt set (" + ", ".join(bench_mod.BUILTIN_SETS) + "), a JSONL file "
                     '({"turns": [...]} per line), or a public name (' + ", ".join(bench_mod.PUBLIC_SETS) +
                     "; needs `datasets` and the network). Default: the profile's [bench] prompts, else chat."),
        click.option("--block-sizes", "-B", default=None, help=block_sizes_help),
        *between,
        repeats_option,
        click.option("--max-samples", "-n", type=int, default=max_samples, show_default=max_samples is not None,
                     help=max_samples_help),
        click.option("--max-new-tokens", type=int, default=None,
                     help=f"Most tokens per turn (default: the profile's, at most {bench_mod.DEFAULT_MAX_NEW})."),
    ]

    def decorate(fn):
        for option in reversed(options):
            fn = option(fn)
        return fn

    return decorate


def _setup(flags: dict, dataset: Optional[str], block_sizes: Optional[str], max_samples: Optional[int], repeats: int):
    """(profile settings, engine config, samples, dataset name, block sizes) from the shared options;
    `flags` are engine_options' values."""
    from dflash_tui.core.settings import load_settings
    from dflash_tui.measure.runs import check_repeats

    check_repeats(repeats)
    url = flags.pop("url")
    settings, config = load_settings(flags.pop("profile"), flags.pop("engine") or ("remote" if url else None),
                                     flags.pop("target"), flags.pop("draft"), url=url, **flags)
    samples, dataset_name = bench_mod.load_dataset(dataset or bench_mod.default_dataset(settings), max_samples)
    return settings, config, samples, dataset_name, bench_mod.block_sizes_for(block_sizes, settings, config)


def check_output(output: Optional[str]) -> None:
    """Refuse an --output the results could not or must not be written to before the run, not after it: a
    missing or read-only folder, a FIFO or a device (/dev/full), a session file (engines/files.py)."""
    if output:
        files.check_output(Path(output), option="--output", protected=[store.sessions_dir()])


@click.command(epilog=bench_mod.JSON_SCHEMA_HELP)
@measure_options("Comma-separated block sizes, 1 to 64 (default: 1,2,4,8,16 and the profile's).", None,
                 "Use at most N samples of the prompt set.")
@click.option("--thinking/--no-thinking", default=False, show_default=True, help="enable_thinking for the chat template.")
@click.option("--temperature", "-t", type=float, default=0.0, show_default=True, help="0 = greedy.")
@click.option("--no-framework", is_flag=True, help="Skip the framework's own generate baseline.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON (schema below) instead of the table.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Also write the results to FILE as JSON (schema below).")
def bench(dataset, block_sizes, repeats, max_samples, max_new_tokens, thinking, temperature, no_framework, as_json,
          output, **flags):
    """Benchmark a profile on a prompt set: block 1 (the baseline), each block size, and the framework's own
    generate (transformers on the CUDA engine, mlx-lm on MLX), each after a warm-up and --repeats times.

    Prints, per block size, the best throughput of the runs and their spread, speedup against the
    baseline, mean acceptance length (tau) and the acceptance histogram, as the public DFlash benchmark
    does. Progress goes to stderr.
    """
    check_output(output)  # before anything else: the run's results must have a place to go
    settings, config, samples, dataset_name, sizes = _setup(flags, dataset, block_sizes, max_samples, repeats)
    max_new = bench_mod.max_new_for(max_new_tokens, settings)  # every flag is checked before the weights load
    no_framework = no_framework or config.engine == "remote"  # the weights stay on the server
    result = _with_progress(bench_mod.run_bench, _load(config), samples, sizes, max_new_tokens=max_new,
                            temperature=temperature,
                            thinking=thinking, framework=not no_framework, system_prompt=settings.system_prompt,
                            dataset=dataset_name, profile=settings.name, repeats=repeats)
    text = json_text(result.to_dict(), indent=1)
    click.echo(text if as_json else bench_mod.format_result(result, color_enabled()))
    if output:  # a new file renamed into place (engines/files.py); a failure is one sentence after the table
        files.write_output(Path(output), (text + "\n").encode("utf-8"), option="--output",
                           protected=[store.sessions_dir()], mode=0o600)
        click.echo(printable(f"wrote {output}"), err=True)


@click.command()
@measure_options("Block sizes to try (default: 1,2,4,8,16 and the profile's, up to 64).", 8, "Use at most N samples.",
                 click.option("--draft-windows", default=None,
                              help="Draft windows to try, comma-separated, 'none' for no window (default when the "
                                   "profile sets one: W/4, W/2, W and none)."))
@click.option("--thinking/--no-thinking", default=None, help="enable_thinking (default: the profile's).")
@click.option("--dry-run", is_flag=True, help="Print the table and the best setting; write nothing.")
def tune(dataset, block_sizes, draft_windows, repeats, max_samples, max_new_tokens, thinking, dry_run, **flags):
    """Sweep block sizes (and draft windows when the profile sets one) on a prompt set at temperature 0,
    --repeats runs each after a warm-up, and print the table. The fastest setting is written into your
    copy of the profile (created from the built-in one in `dflash profile path` if needed; comments are
    kept, and a changed line's comment says what tune measured) only after at least 3 runs, and only when
    its best beats the current setting's best by more than the spread between runs; tune says why
    either way."""
    from dflash_tui.measure import tune as tune_mod

    settings, config, samples, dataset_name, sizes = _setup(flags, dataset, block_sizes, max_samples, repeats)
    if not dry_run:  # what could stop the writing is checked before the sweep, not after
        few = tune_mod.too_few_repeats(repeats)
        if few:
            raise UserError(f"--repeats {repeats}: {few}; pass --repeats {tune_mod.MIN_REPEATS} or more, "
                            "or --dry-run to only look.")
        tune_mod.check_writable(tune_mod.user_copy_path(settings))  # a read-only config folder: refused now
    windows = tune_mod.windows_for(draft_windows, settings, config)
    max_new = bench_mod.max_new_for(max_new_tokens, settings)
    loaded = _load(config)
    result = _with_progress(tune_mod.sweep, loaded, samples, sizes, windows, max_new_tokens=max_new,
                            thinking=settings.thinking if thinking is None else thinking,
                            system_prompt=settings.system_prompt, repeats=repeats)
    click.echo(printable(f"tune {settings.name} on {dataset_name} ({len(samples)} samples) · {loaded.name} engine on "
                         f"{loaded.device} · {loaded.dtype}"))
    click.echo(tune_mod.format_sweep(result))
    best = result.best
    click.echo(f"best: {tune_mod.label(best, result)} ({best.decode_tokens_per_s:.1f} tok/s, "
               f"{times(best.speedup)} vs block 1)")
    decision = tune_mod.decide(result)
    click.echo(decision.reason)
    if dry_run:
        click.echo("dry run: no profile written", err=True)
        return
    if not decision.write:
        return
    comment = tune_mod.comment_for(result, dataset_name, loaded.trained_block_size)
    path, changes = tune_mod.write_best(settings, best, tune_window=result.windows != [None], engine=loaded.name,
                                        comment=comment)
    if changes:
        for change in changes:
            click.echo(printable(f"  {change}"))
        click.echo(printable(f"wrote {path}"))
    else:
        click.echo(printable(f"{path} already has these values; nothing changed"))
