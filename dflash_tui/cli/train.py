"""`dflash train-draft`: train a DFlash draft for a target (engines/cuda/training/ does the work)."""

from __future__ import annotations

import math
import sys

import click

from dflash_tui.cli.style import console
from dflash_tui.engines.errors import UserError


def _progress_bar():
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(
        TextColumn("{task.description}"), BarColumn(bar_width=16), MofNCompleteColumn(),
        TextColumn("{task.fields[stats]}"), TextColumn("eta"), TimeRemainingColumn(compact=True),
        console=console(err=True),
    )


def stop(bar) -> None:
    """End the bar if it ever showed (rich's stop of a bar never started still writes a blank line)."""
    if bar.live.is_started:
        bar.stop()


def _count(value: float) -> str:
    return f"{value / 1000:.1f}k" if value >= 1000 else f"{value:.0f}"


def check_values(cfg) -> None:
    """The numbers training runs on, checked before anything is read or loaded (one sentence each)."""
    if cfg.val_prompts is not None and cfg.val_prompts < 0:
        raise UserError(f"--val-prompts {cfg.val_prompts} is negative; give a count of held-out conversations.")
    if not math.isfinite(cfg.lr) or cfg.lr <= 0:
        raise UserError(f"--lr {cfg.lr} is not a positive learning rate; use a value such as 1e-3 (it would train "
                        "NaN weights).")
    if cfg.max_new_tokens is not None and cfg.max_new_tokens < 1:
        raise UserError(f"--max-new-tokens {cfg.max_new_tokens} must be a positive number of tokens (the target "
                        "would write empty responses).")
    if cfg.val_max_new < 1:
        raise UserError(f"--val-max-new {cfg.val_max_new} must be a positive number of tokens (tau is measured on "
                        "what the held-out prompts generate).")


@click.command("train-draft")
@click.option("--target", required=True, help="Target model: a Hugging Face directory or hub id.")
@click.option("--data", required=True, help='JSONL conversations: {"turns": [user, assistant, ...]} or {"messages": [...]}; '
              'optional "thinking": true/false per line.')
@click.option("--out", required=True, help="Output directory: config.json + model.safetensors (public DFlash layout), "
              "written when training ends; also responses.jsonl and train_state.pt unless --work-dir. It must be "
              "new, empty or train-draft's own (an earlier run's, to resume), and must not hold --data; it is "
              "claimed before any weight loads.")
@click.option("--block-size", type=int, default=16, show_default=True, help="Block size the draft is trained for (2-64).")
@click.option("--draft-layers", type=int, default=2, show_default=True, help="Draft decoder layers.")
@click.option("--target-layer-ids", default=None,
              help="Comma list of target layers whose outputs feed the draft [default: as many as draft layers, "
                   "spread between layer 1 and L-3 like the public drafts].")
@click.option("--epochs", type=int, default=3, show_default=True)
@click.option("--lr", type=float, default=1e-3, show_default=True, help="Peak AdamW learning rate (warm-up, cosine decay).")
@click.option("--batch-size", type=int, default=8, show_default=True, help="Sequences per step.")
@click.option("--max-len", type=int, default=512, show_default=True, help="Longest prompt+response in tokens (longer ones are cut).")
@click.option("--gamma", type=float, default=None, help="Loss decay over block positions [default: 7 at block 16, 4 at block 8].")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--responses", type=click.Choice(["generate", "given"]), default="generate", show_default=True,
              help="generate: the target writes every response (greedy, cached in OUT/responses.jsonl); given: the data's.")
@click.option("--anchors-per-seq", type=int, default=12, show_default=True, help="Random blocks per sequence per step.")
@click.option("--max-steps", type=int, default=None, help="Stop after this many steps in all (time-boxing; the schedule fits it).")
@click.option("--dtype", type=click.Choice(["float32", "float16", "bfloat16"]), default="float32", show_default=True,
              help="dtype of the saved weights (the master weights train in float32).")
@click.option("--compute", type=click.Choice(["auto", "float32", "bfloat16"]), default="auto", show_default=True,
              help="Arithmetic of the training steps: bfloat16 autocast, or float32. auto: bfloat16 on a GPU "
                   "and on CPUs with native bf16, float32 elsewhere.")
@click.option("--mask-token", default=None,
              help="Token (or numeric id) used as the mask [default: <|mask|> if the tokenizer has it, else the "
                   "first unused embedding row].")
@click.option("--val-prompts", type=int, default=None, help="Held-out conversations for the tau estimate [default: 5%, at most 16].")
@click.option("--val-max-new", type=int, default=96, show_default=True, help="Tokens generated per held-out prompt.")
@click.option("--max-new-tokens", type=int, default=None, help="Longest response the target writes [default: up to --max-len].")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--gen-batch", type=int, default=1, show_default=True,
              help="Responses the target writes at once: 1 = one by one through the real decoding loop; more = "
                   "batched transformers generate (faster; greedy, may differ at near-ties).")
@click.option("--work-dir", default=None, help="Where responses.jsonl and train_state.pt live [default: OUT]; keep them "
              "out of a directory you publish. Same rule as --out: new, empty or train-draft's own, without --data.")
@click.option("--init-draft", default=None, metavar="DIR",
              help="Start from this draft's weights instead of random ones (fine-tune an existing draft for a "
                   "retrained or fine-tuned target); its shape, target layers and block size must match.")
@click.option("--arch", type=click.Choice(["dflash", "dflash2"]), default="dflash", show_default=True,
              help="dflash2: add DFlash 2's candidate selector and dynamic convolutions (docs/dflash2.md); with "
                   "--init-draft a DFlash 1 draft, they start from its weights.")
@click.option("--selector-top-k", type=int, default=8, show_default=True,
              help="DFlash 2: candidates per block position the selector scores.")
@click.option("--fresh", is_flag=True, help="Start over even if OUT/train_state.pt exists.")
def train_draft(**options) -> None:
    """Train a DFlash draft for TARGET on conversations (self-distillation by default).

    A rerun with the same arguments resumes from OUT/train_state.pt (Ctrl-C saves it). The last line
    printed is the measured mean acceptance length (tau) on held-out prompts at the trained block size.
    """
    from dflash_tui.engines.cuda.training import Interrupted, TrainConfig
    from dflash_tui.engines.cuda.training import train_draft as run

    cfg = TrainConfig(**options)
    check_values(cfg)
    from dflash_tui.engines.checkpoints import TargetInfo
    from dflash_tui.engines.cuda.target import check_family
    from dflash_tui.engines.cuda.training.trainer import check_args

    check_args(cfg)  # the options first, as the trainer checks them
    check_family(TargetInfo.read(cfg.target))  # an unsupported model type: refused before the tokenizer loads
    bar = _progress_bar()
    tasks: dict[str, int] = {}
    logged: dict[str, int] = {}  # off a terminal: the last twentieth of each task a line was printed for

    def progress(p) -> None:
        if p.kind == "info":
            bar.console.print(p.message)
            return
        if p.kind == "validate":
            bar.console.print(f"step {p.done}: tau {p.tau:.2f} at block {cfg.block_size} (epoch {p.epoch})")
            return
        name = "responses" if p.kind == "generate" else "training "
        stats = "" if p.kind == "generate" else (
            f"loss {p.loss:.3f} {p.steps_per_s:.1f} it/s {_count(p.tokens_per_s)} tok/s")
        if not bar.console.is_terminal:  # a log or a pipe: a plain line every 5%, which a redrawn bar never writes
            twentieth = 20 * p.done // max(p.total, 1)
            if logged.get(name, -1) < twentieth:
                logged[name] = twentieth
                bar.console.print(f"{name.strip()} {p.done}/{p.total} {stats}".rstrip(), markup=False,
                                  highlight=False)
            return
        if name not in tasks:
            if not bar.live.is_started:
                bar.start()
            tasks[name] = bar.add_task(name, total=p.total, completed=p.done, stats="")
        bar.update(tasks[name], total=p.total, completed=p.done, stats=stats)

    try:
        result = run(cfg, progress)  # a UserError reaches the group: one sentence, exit 2
    except Interrupted as exc:
        stop(bar)
        click.echo(f"Interrupted at step {exc.step}; state saved to {exc.path}. Rerun the same command to resume.", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        stop(bar)
        click.echo("Interrupted; responses written so far are cached in the output directory. Rerun to resume.", err=True)
        sys.exit(130)
    finally:
        stop(bar)
    click.echo(f"steps {result.steps} · loss {result.loss:.3f} · {result.steps_per_s:.1f} step/s · "
               f"{result.tokens_per_s:,.0f} tok/s · draft in {result.out}")
    click.echo(f"tau {result.tau:.2f} at block {cfg.block_size}")
