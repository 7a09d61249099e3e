"""Where `train-draft` may write, and how it writes there without ever leaving a torn model.

An output folder is ours when it is new, empty, or holds what an earlier run of `train-draft` left
(its `training.json` marker, `responses.jsonl`, `train_state.pt`): a rerun of the same command
resumes there. Anything else, another model, the target itself, the data file, a plain file, is
refused before any weight loads. The finished draft is written into a hidden folder first and moved
into place file by file with `os.replace`, so a reader never sees half a `model.safetensors`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from .errors import UserError

MARKER = "training.json"  # written beside every draft train-draft publishes
MODEL_FILES = ("config.json", "*.safetensors", "*.bin", "*.gguf", "tokenizer*.json")


def _same_or_inside(path: Path, other: Path) -> bool:
    path, other = path.resolve(), other.resolve()
    return path == other or other in path.parents


def _holds_model(folder: Path) -> bool:
    return any(any(folder.glob(pattern)) for pattern in MODEL_FILES)


def check_output_dir(out: Path, *, option: str, target: Path, data: Path, writes_model: bool = True) -> None:
    """Refuse an output folder that is not ours to write (one sentence saying why and what to pass).
    `writes_model` is False for the work folder, which only gains responses.jsonl and train_state.pt."""
    if out.resolve() == data.resolve():
        raise UserError(f"{option} {out} is the data file; name a new folder for the draft.")
    if out.exists() and not out.is_dir():
        raise UserError(f"{option} {out} is a file; train-draft writes a folder there, so name a new folder.")
    if _same_or_inside(out, target) or _same_or_inside(target, out):
        raise UserError(f"{option} {out} is the target's folder (or contains it); name a new folder for the draft.")
    if writes_model and out.is_dir() and not (out / MARKER).is_file() and _holds_model(out):
        raise UserError(
            f"{option} {out} already holds a model that train-draft did not write there; name a new or empty "
            "folder, so that nothing you keep is overwritten."
        )


def publish(out: Path, write: Callable[[Path], None]) -> None:
    """Call `write(folder)` on a hidden folder beside `out`, then move every file it wrote into `out`.

    Each file lands with one atomic rename; the marker goes last, so a folder with the marker always
    holds a complete draft."""
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".draft-", dir=out))
    try:
        write(staging)
        files = sorted((p for p in staging.iterdir() if p.is_file()), key=lambda p: p.name == MARKER)
        for file in files:
            os.replace(file, out / file.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
