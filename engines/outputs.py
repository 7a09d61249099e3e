"""Where `train-draft` may write, and how it writes there without ever leaving a torn model.

The ownership rule, the same for `--out` and `--work-dir`: train-draft writes only into a folder that
is new, empty, or carries its own marker, and never a file it did not create. Its markers are the
hidden claim `.dflash-train-draft` (`CLAIM`), written into the folder before any weight loads, and
`training.json` (`MARKER`), written beside every draft it publishes, where it replaces the claim
(earlier versions wrote only that one). A marker counts only when it is a JSON object saying
`"written_by": "dflash train-draft"`: a `training.json` of the user's own is no mark of ours. Any
other folder (the user's files, `$HOME`, another model) is refused in one sentence naming it and some
of its files, and so are the target's folder, a plain file, and a folder holding the `--data` file
(by its path as given, by the path its links lead to, or as another hard link of it); a folder that
cannot be created or claimed (read-only, full, /proc) is refused the same way, before anything
trains. An interrupted run leaves its claim, so a rerun of the command resumes there.

The finished draft is written into a hidden folder first and moved into place file by file with
`os.replace`, so a reader never sees half a `model.safetensors`. Beside the weights goes a model card
(README.md, `draft_card`) saying what the draft is and which loaders read it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

from dflash_tui.engines import files
from dflash_tui.engines.errors import UserError

MARKER = "training.json"  # written beside every draft train-draft publishes
CLAIM = ".dflash-train-draft"  # written into a folder train-draft takes, before any weight loads
WRITTEN_BY = "dflash train-draft"  # what both say they were written by
CARD = "README.md"  # the model card written beside it
SGLANG_DEFAULT_MASK = "<|MASK|>"  # SGLang's mask token string when dflash_config.mask_token is absent
MODEL_FILES = ("config.json", "*.safetensors", "*.bin", "*.gguf", "tokenizer*.json")


def _same_or_inside(path: Path, other: Path) -> bool:
    path, other = path.resolve(), other.resolve()
    return path == other or other in path.parents


def _holds_model(folder: Path) -> bool:
    return any(any(folder.glob(pattern)) for pattern in MODEL_FILES)


def _marked(folder: Path) -> bool:
    """Whether train-draft's claim or marker is in `folder`: a regular file (a FIFO is never opened) holding
    a JSON object written by train-draft. A file of the user's that merely has the name does not count."""
    for name in (CLAIM, MARKER):
        try:
            if not stat.S_ISREG(os.stat(folder / name).st_mode):
                continue
            with open(folder / name, "rb") as fh:
                record = json.loads(fh.read(1 << 20))
        except (OSError, ValueError, RecursionError):
            continue
        if isinstance(record, dict) and record.get("written_by") == WRITTEN_BY:
            return True
    return False


def _holds_file(folder: Path, file: Path) -> bool:
    """Whether `file` lies in `folder` as given (through a link there), where its links lead, or as a hard
    link of one of the folder's files: train-draft's writes there could reach it."""
    given, where = Path(os.path.abspath(file)), Path(os.path.abspath(folder))
    if _same_or_inside(file, folder) or given == where or where in given.parents:
        return True
    try:
        data = os.stat(file)
        entries = list(folder.iterdir()) if folder.is_dir() else []
    except OSError:
        return False
    return any(_same_inode(entry, data) for entry in entries)


def _same_inode(path: Path, st: os.stat_result) -> bool:
    try:
        other = os.stat(path)
    except OSError:
        return False
    return (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino)


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def check_output_dir(out: Path, *, option: str, target: Path, data: Path) -> None:
    """Refuse a folder that the ownership rule (above) does not give to train-draft, in one sentence
    saying why and what to pass. Writes nothing; `claim_output_dir` takes the folder afterwards."""
    try:
        _check_output_dir(out, option, target, data.expanduser())
    except OSError as exc:  # e.g. a folder on the way that this user may not search
        raise UserError(f"{option} {out} cannot be read ({_reason(exc)}); name a new or empty folder you can "
                        "write to.") from None


def _check_output_dir(out: Path, option: str, target: Path, data: Path) -> None:
    if out.resolve() == data.resolve():
        raise UserError(f"{option} {out} is the data file; name a new folder for the draft.")
    if out.exists() and not out.is_dir():
        raise UserError(f"{option} {out} is a file; train-draft writes a folder there, so name a new folder.")
    if _same_or_inside(out, target) or _same_or_inside(target, out):
        raise UserError(f"{option} {out} is the target's folder (or contains it); name a new folder for the draft.")
    if _holds_file(out, data):
        raise UserError(f"--data {data} is inside {option} {out}, where train-draft writes its own files; move the "
                        "data file out of it or name another folder.")
    if not out.is_dir() or _marked(out):
        return
    found = sorted((p.name for p in out.iterdir()), key=lambda name: (name.startswith("."), name))
    if not found:
        return
    names = ", ".join(found[:2]) + (f" and {len(found) - 2} more" if len(found) > 2 else "")
    what = "a model" if _holds_model(out) else "files"
    raise UserError(f"{option} {out} already holds {what} ({names}) and no mark of train-draft's; name a new or empty "
                    "folder, so that nothing you keep is overwritten.")


def claim_output_dir(out: Path, *, option: str) -> None:
    """Create `out` (parents too) and write the claim into it, through a temporary file and `os.replace`.
    A folder that cannot be created or written is a UserError, raised before any weight loads."""
    made = {"written_by": WRITTEN_BY, "claimed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "note": "train-draft took this folder; it writes its draft and work files here, and a rerun resumes here."}
    try:
        out.mkdir(parents=True, exist_ok=True)
        files.write_file(out / CLAIM, (json.dumps(made, indent=2) + "\n").encode(), mode=None)  # engines/files.py
    except OSError as exc:
        raise UserError(f"{option} {out} cannot be written ({_reason(exc)}); name a folder you can write to, on a "
                        "disk with free space.") from None


def publish(out: Path, write: Callable[[Path], None]) -> None:
    """Call `write(folder)` on a hidden folder beside `out`, then move every file it wrote into `out`.

    Each file lands with one atomic rename; the marker goes last, so a folder with the marker always
    holds a complete draft, and then replaces the claim (a published folder carries no hidden file).
    Files get the usual umask permissions (safetensors writes its file owner-only), so a server running
    as another user can read the draft. A disk that fills (or a folder that turns read-only) on the way is
    one sentence; the staging folder is removed, so no half-written file stays."""
    umask = os.umask(0)
    os.umask(umask)
    staging = None
    try:
        out.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".draft-", dir=out))
        write(staging)
        files = sorted((p for p in staging.iterdir() if p.is_file()), key=lambda p: p.name == MARKER)
        for file in files:
            os.chmod(file, 0o666 & ~umask)
            os.replace(file, out / file.name)
        if (out / MARKER).is_file():
            with contextlib.suppress(OSError):
                (out / CLAIM).unlink(missing_ok=True)
    except OSError as exc:
        raise UserError(f"The draft cannot be written into {out} ({_reason(exc)}); free space there or make it "
                        "writable, and rerun the same command.") from None
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


def mask_spelling(tokenizer, mask_id: int) -> tuple[Optional[str], Optional[int]]:
    """(the mask token's string, or None for an embedding row no token uses; the id SGLang's default
    mask string has in the tokenizer when that clashes with `mask_id` and no string is written)."""
    vocab = tokenizer.get_vocab()
    token = tokenizer.convert_ids_to_tokens(mask_id) if mask_id < len(tokenizer) else None
    if token is not None and vocab.get(token) != mask_id:
        token = None
    clash = vocab.get(SGLANG_DEFAULT_MASK)
    return token, clash if token is None and clash not in (None, mask_id) else None


def draft_card(config: dict, *, target: str, draft: str, steps: int, tau: Optional[float], target_dtype: str,
               mask_token: Optional[str] = None, sglang_mask_clash: Optional[int] = None) -> str:
    """The model card (README.md) of a draft train-draft wrote: what it is, which loaders read it (with
    launch commands), and what not to use.

    The loader claims follow a reading of their code (README "Which loaders read a trained draft"):
    vLLM's qwen3_dflash.py, SGLang's models/dflash.py + speculative/dflash_utils.py + dflash_worker.py,
    z-lab/dflash's dflash/model.py and dflash/model_mlx.py. `draft` is the folder the commands name;
    `sglang_mask_clash` is the id SGLang's default mask string has in the target's tokenizer when it
    differs from ours and no `mask_token` is written (SGLang then refuses the draft)."""
    block = int(config["block_size"])
    dflash = config["dflash_config"]
    ids, mask_id = list(dflash["target_layer_ids"]), int(dflash["mask_token_id"])
    dtype = str(config.get("torch_dtype", config.get("dtype", "float32")))
    cell = mask_token.replace("|", "\\|") if mask_token else None  # a bare | would split the table cell
    mask = f"id {mask_id}" + (f", token `{cell}`" if cell else ", an embedding row no token uses")
    tau_text = (f"{tau:.2f}: mean acceptance length (tokens per target forward) of the real decoding loop, "
                f"greedy, on held-out conversations at block size {block}") if tau is not None else "not measured"
    spec = {"method": "dflash", "model": draft, "num_speculative_tokens": block - 1}
    q = shlex.quote
    dflash_cmd = f"dflash generate --target {q(target)} --draft {q(draft)} --block-size {block} \"Hello\""
    vllm_cmd = f"vllm serve {q(target)} --speculative-config {q(json.dumps(spec))}"
    sglang_cmd = (f"python -m sglang.launch_server --model-path {q(target)} --speculative-algorithm DFLASH "
                  f"--speculative-draft-model-path {q(draft)} --speculative-num-draft-tokens {block} --dtype {target_dtype}")
    types = config.get("layer_types") or []
    lines = [
        "---", "tags:", "- dflash", "- speculative-decoding", "- block-diffusion-draft", "---", "",
        f"# DFlash draft for `{target}`", "",
        "A DFlash block-diffusion draft written by `dflash train-draft`. In each block it proposes "
        f"{block - 1} tokens at once for `{target}`, which verifies them in one forward pass (lossless). It "
        "reads that target's hidden states and uses the target's own token embeddings and LM head (this folder "
        "has neither), so it is of no use with any other model, a fine-tune of the target included.", "",
        "| | |", "|---|---|",
        f"| Target | `{target}` ({config.get('num_target_layers', '?')} layers, vocab {config.get('vocab_size', '?')}) |",
        f"| Block size | {block} (`block_size`) |",
        f"| Draft layers | {config['num_hidden_layers']}, hidden {config['hidden_size']}, all full (non-causal) attention |"
        if not any(t == "sliding_attention" for t in types) else
        f"| Draft layers | {config['num_hidden_layers']} (layer_types {types}) |",
        f"| Target layers read | {ids} (`dflash_config.target_layer_ids`: outputs of these layers) |",
        f"| Mask token | {mask} (`dflash_config.mask_token_id`, `mask_token`) |" if cell else
        f"| Mask token | {mask} (`dflash_config.mask_token_id`) |",
        f"| Training | {steps} steps, self-distillation (details in `training.json`) |",
        f"| Measured tau | {tau_text} |",
        f"| Weights | `model.safetensors` in {dtype}: `fc`, `hidden_norm`, `norm`, `layers.N.*` (Qwen3 names) |", "",
        "## Loaders that read this draft", "",
        f"The commands name this folder, `{draft}`; after uploading it to the Hugging Face Hub, name the repo id "
        "instead.", "",
        "**dflash** (this project; both engines):", "", "```sh", dflash_cmd, "```", "",
        "**vLLM** (its `DFlashDraftModel` architecture, `vllm/model_executor/models/qwen3_dflash.py`):", "",
        "```sh", vllm_cmd, "```", "",
        f"- `num_speculative_tokens` is the block size minus one ({block - 1}). Name `\"method\": \"dflash\"`: "
        "vLLM guesses the method from the draft's path only when the path contains \"dflash\".",
        "- The draft runs in the target's dtype; its attention is non-causal, so vLLM needs an attention backend "
        "that supports that (z-lab's README passes `--attention-backend flash_attn`).",
        "- vLLM taps the target layers in `dflash_config.target_layer_ids` and sizes `fc` from their count.", "",
        "**SGLang** (`--speculative-algorithm DFLASH`, `python/sglang/srt/models/dflash.py`):", "",
        "```sh", sglang_cmd, "```", "",
        f"- `--speculative-num-draft-tokens` is the block size ({block}); SGLang warns when it differs from "
        "`block_size`.",
        f"- `--dtype {target_dtype}` (the target's dtype): with `auto`, SGLang takes the draft's dtype from this "
        "folder's config.json and runs a float32 draft in float16, beside a target in its own dtype.",
        "- SGLang captures the target's hidden states in the target's own model class: check that your SGLang "
        "build supports DFLASH for this target's architecture.",
    ]
    if sglang_mask_clash is not None:
        lines.append(
            f"- **SGLang refuses this draft as written**: the target's tokenizer has `{SGLANG_DEFAULT_MASK}` as id "
            f"{sglang_mask_clash}, but the draft's mask is id {mask_id}; SGLang cross-checks the two. Retrain with "
            f"`--mask-token '{SGLANG_DEFAULT_MASK}'`, or serve it with vLLM or dflash.")
    lines += [
        "",
        "**z-lab/dflash's MLX loader** (`dflash.model_mlx.load_draft`) reads every key it needs from this "
        "config.json and these weight names, but it fetches the draft by hub id: upload the folder first.", "",
        "## Do not use", "",
        "- `transformers.AutoModel.from_pretrained(DRAFT, trust_remote_code=True)` (the route z-lab's README "
        "shows for its own drafts). Their hub repos ship a `dflash.py` modeling file and an `auto_map` entry; this "
        "folder ships no code, so transformers builds a plain `Qwen3Model` from `model_type: qwen3`, silently drops "
        "`fc.weight` and `hidden_norm.weight` and initialises `embed_tokens` at random. It loads without an error "
        "and is not this draft. The same goes for `AutoModelForCausalLM` and pipelines.",
        f"- Any target but `{target}`, or a block size above {block} (acceptance drops beyond the trained size).",
    ]
    if any(t == "sliding_attention" for t in types):
        lines.append("- The loader notes above were checked for full-attention drafts only; this one has sliding "
                     "window layers.")
    return "\n".join(lines) + "\n"
