"""`dflash replay`, `dflash bench` and `dflash tune`: one engine, several block sizes, one table."""

from __future__ import annotations

import json
import sys
import click

from engines import load_engine

from dflash_tui.measure import bench as bench_mod
from dflash_tui.measure import replay as replay_mod
from dflash_tui.cli.generate import engine_options
from dflash_tui.cli.style import color_enabled


class Progress:
    """Progress on stderr: a bar redrawn in place on a terminal, one line per change otherwise."""

    def __init__(self, stream=None, width: int = 24):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.width = width
        self.last = ""

    def __call__(self, done: int, total: int, label: str) -> None:
        filled = round(self.width * done / total) if total else self.width
        bar = "█" * filled + "░" * (self.width - filled)
        line = f"{bar} {done}/{total} {label}"
        if self.tty:
            self.stream.write("\r\033[K" + line)
        elif label != self.last:
            self.stream.write(line + "\n")
        self.last = label
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\r\033[K")
            self.stream.flush()


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
@click.option("--no-save", is_flag=True, help="Do not save the comparison next to the session.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON (schema below).")
def replay(session_id, block_sizes, engine, device, dtype, temperature, no_save, as_json):
    """Re-run every completed turn of session ID once per block size and compare.

    Every block size gets the recorded prompt ids (history included). The table shows, per block
    size, tau (mean acceptance length), the acceptance histogram (lengths 1..B), decode tok/s,
    speedup vs block 1, time to first token, peak memory and, at temperature 0, whether the output is
    identical to the recording and across block sizes (✓), or where it first differs and the target's
    top-2 logit margin there. A replay on a target other than the recorded one (e.g. a quantized MLX
    build) says "different target". The comparison is saved next to the session as
    `<session>.replay-<time>.json` (schema "dflash-replay/1"); --json prints it. Progress goes to stderr.
    """
    from dflash_tui.core import sessions

    sizes = replay_mod.parse_block_sizes(block_sizes)
    session = sessions.load_session(session_id)
    for warning in session.warnings:
        click.echo(f"warning: {warning}", err=True)
    session.warnings = []
    replay_mod.recorded_turns(session)  # fail before loading anything when nothing can be replayed
    config = replay_mod.engine_config_for(session, engine, device, dtype)
    click.echo(f"loading {config.target} on the {config.engine} engine ...", err=True)
    loaded = load_engine(config)
    for warning in loaded.warnings:
        click.echo(f"note: {warning}", err=True)
    progress = Progress()
    try:
        comparison = replay_mod.run_replay(loaded, session, sizes, temperature=temperature, progress=progress)
    finally:
        progress.close()
    if not no_save:
        path = replay_mod.save_comparison(comparison, session.path)
        click.echo(f"saved {path}", err=True)
    for warning in comparison["warnings"]:
        click.echo(f"note: {warning}", err=True)
    if as_json:
        click.echo(json.dumps(comparison, ensure_ascii=False))
    else:
        click.echo(replay_mod.report(comparison, color_enabled(), _width()))


def _dataset_option(fn):
    return click.option("--dataset", "-d", default=None,
                        help="Built-in prompt set (" + ", ".join(bench_mod.BUILTIN_SETS) + "), a JSONL file "
                        '({"turns": [...]} per line), or a public name (' + ", ".join(bench_mod.PUBLIC_SETS) +
                        "; needs `datasets` and the network). Default: the demo set for the demo profile, "
                        "else chat.")(fn)


@click.command(epilog=bench_mod.JSON_SCHEMA_HELP)
@engine_options
@_dataset_option
@click.option("--block-sizes", "-B", default=None,
              help="Comma-separated block sizes, 1 to 64 (default: 1,2,4,8,16 and the profile's).")
@click.option("--max-samples", "-n", type=int, default=None, help="Use at most N samples of the prompt set.")
@click.option("--max-new-tokens", type=int, default=None, help=f"Most tokens per turn (default: the profile's, at most {bench_mod.DEFAULT_MAX_NEW}).")
@click.option("--thinking/--no-thinking", default=False, show_default=True, help="enable_thinking for the chat template.")
@click.option("--temperature", "-t", type=float, default=0.0, show_default=True, help="0 = greedy.")
@click.option("--no-framework", is_flag=True, help="Skip the framework's own generate baseline.")
@click.option("--json", "json_file", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Also write the results to FILE as JSON (schema below).")
def bench(profile, target, draft, engine, url, model, api_key, device, dtype, block_size, draft_window, dataset, block_sizes, max_samples,
          max_new_tokens, thinking, temperature, no_framework, json_file):
    """Benchmark a profile on a prompt set: block 1 (the baseline), each block size, and the framework's own
    generate (transformers on the CUDA engine, mlx-lm on MLX), after a warm-up.

    Prints, per block size, throughput against the baseline, speedup, mean acceptance length (tau) and
    the acceptance histogram, as the public DFlash benchmark does. Progress goes to stderr.
    """
    from dflash_tui.core.settings import load_settings

    settings, config = load_settings(profile, engine or ("remote" if url else None), target, draft, device=device,
                                     dtype=dtype, block_size=block_size, draft_window=draft_window, url=url,
                                     model=model, api_key=api_key)
    samples, dataset_name = bench_mod.load_dataset(dataset or bench_mod.default_dataset(settings), max_samples)
    sizes = bench_mod.block_sizes_for(block_sizes, settings, config)
    no_framework = no_framework or config.engine == "remote"  # the weights stay on the server
    loaded = load_engine(config)
    for warning in loaded.warnings:
        click.echo(f"note: {warning}", err=True)
    progress = Progress()
    try:
        result = bench_mod.run_bench(loaded, samples, sizes, max_new_tokens=bench_mod.max_new_for(max_new_tokens, settings),
                                     temperature=temperature, thinking=thinking, framework=not no_framework,
                                     progress=progress, system_prompt=settings.system_prompt,
                                     dataset=dataset_name, profile=settings.name)
    finally:
        progress.close()
    click.echo(bench_mod.format_result(result, color_enabled()))
    if json_file:
        with open(json_file, "w") as f:
            json.dump(result, f, ensure_ascii=False, indent=1)
            f.write("\n")
        click.echo(f"wrote {json_file}", err=True)


@click.command()
@engine_options
@_dataset_option
@click.option("--block-sizes", "-B", default=None,
              help="Block sizes to try (default: 1,2,4,8,16 and the profile's, up to 64).")
@click.option("--draft-windows", default=None,
              help="Draft windows to try, comma-separated, 'none' for no window (default when the profile sets "
                   "one: W/4, W/2, W and none).")
@click.option("--max-samples", "-n", type=int, default=8, show_default=True, help="Use at most N samples.")
@click.option("--max-new-tokens", type=int, default=None, help=f"Most tokens per turn (default: the profile's, at most {bench_mod.DEFAULT_MAX_NEW}).")
@click.option("--thinking/--no-thinking", default=None, help="enable_thinking (default: the profile's).")
@click.option("--dry-run", is_flag=True, help="Print the table and the best setting; write nothing.")
def tune(profile, target, draft, engine, url, model, api_key, device, dtype, block_size, draft_window, dataset, block_sizes, draft_windows,
         max_samples, max_new_tokens, thinking, dry_run):
    """Sweep block sizes (and draft windows when the profile sets one) on a prompt set at temperature 0,
    print the table and write the fastest setting into your copy of the profile (created from the
    built-in one in `dflash profile path` if needed; comments are kept), saying what changed."""
    from dflash_tui.measure import tune as tune_mod
    from dflash_tui.core.settings import load_settings

    settings, config = load_settings(profile, engine or ("remote" if url else None), target, draft, device=device,
                                     dtype=dtype, block_size=block_size, draft_window=draft_window, url=url,
                                     model=model, api_key=api_key)
    samples, dataset_name = bench_mod.load_dataset(dataset or bench_mod.default_dataset(settings), max_samples)
    sizes = bench_mod.block_sizes_for(block_sizes, settings, config)
    windows = tune_mod.windows_for(draft_windows, settings, config)
    loaded = load_engine(config)
    for warning in loaded.warnings:
        click.echo(f"note: {warning}", err=True)
    progress = Progress()
    try:
        result = tune_mod.sweep(loaded, samples, sizes, windows, max_new_tokens=bench_mod.max_new_for(max_new_tokens, settings),
                                thinking=settings.thinking if thinking is None else thinking,
                                system_prompt=settings.system_prompt, progress=progress)
    finally:
        progress.close()
    click.echo(f"tune {settings.name} on {dataset_name} ({len(samples)} samples) · {loaded.name} engine on "
               f"{loaded.device} · {loaded.dtype}")
    click.echo(tune_mod.format_sweep(result))
    best = result["best"]
    click.echo(f"best: block size {best['block_size']}" + (
        f", draft window {best['draft_window'] or 'none'}" if windows != [None] and best["block_size"] > 1 else "") +
        f" ({best['decode_tokens_per_s']:.1f} tok/s, {best['speedup']:.2f}x vs block 1)")
    if dry_run:
        click.echo("dry run: no profile written", err=True)
        return
    path, changes = tune_mod.write_best(settings, best, tune_window=windows != [None], engine=loaded.name)
    if changes:
        for change in changes:
            click.echo(f"  {change}")
        click.echo(f"wrote {path}")
    else:
        click.echo(f"{path} already has these values; nothing changed")
