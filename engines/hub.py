"""Hugging Face hub checkpoints: which of a pair are cached, what fetching the rest costs, and fetching it.

Front ends ask before a download (`missing`, then `plan` for the sizes, then `fetch` with progress);
the library itself only reads the cache and, when the hub is reachable, downloads what it is asked to
load (`resolve`). HF_HOME and HF_HUB_OFFLINE are honoured as huggingface_hub honours them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from dflash_tui.engines.errors import CheckpointError as _CheckpointError
from dflash_tui.engines.text import printable


def CheckpointError(message: str) -> _CheckpointError:  # noqa: N802 - reads as the exception it builds
    """The error with the names the user typed (hub ids, folders) escaped for a terminal."""
    return _CheckpointError(printable(message))

# What a checkpoint needs: configs, safetensors weights, tokenizer and chat-template files (never code,
# never pickles).
CHECKPOINT_FILES = ["*.json", "*.safetensors", "*.jinja", "tokenizer*", "*.txt", "*.model", "*.tiktoken"]


def looks_like_hub_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "~"))


# huggingface_hub's own reading (constants._is_true): only these words, any case, mean "on"; anything else
# ("0", "off", "2", "false", "") means off. TRANSFORMERS_OFFLINE stands in when HF_HUB_OFFLINE is unset or empty.
TRUE_WORDS = ("1", "ON", "YES", "TRUE")


def offline() -> bool:
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE")
    return value is not None and value.upper() in TRUE_WORDS


def cached(name: str) -> Optional[Path]:
    """The local snapshot of hub id `name`, if the HF cache holds one."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(name, allow_patterns=CHECKPOINT_FILES, local_files_only=True))
    except Exception:  # not cached (or a broken cache entry): the caller decides what to say
        return None


def missing(checkpoints: dict[str, Optional[str]]) -> dict[str, str]:
    """role -> hub id for each named checkpoint that is a hub id and not in the cache (local folders
    and empty roles are left out)."""
    return {role: name for role, name in checkpoints.items()
            if name and not Path(name).expanduser().exists() and looks_like_hub_id(name) and cached(name) is None}


def _commands(absent: dict[str, str]) -> str:
    return " && ".join(f"hf download {name}" for name in absent.values())


def _named(absent: dict[str, str]) -> str:
    parts = [f"the {role} '{name}'" for role, name in absent.items()]
    text = " and ".join(parts)
    return text[0].upper() + text[1:]


def require_cached(checkpoints: dict[str, Optional[str]]) -> None:
    """With HF_HUB_OFFLINE set, one sentence naming every checkpoint that is not cached (not one error
    per checkpoint, each after the other)."""
    if not offline():
        return
    absent = missing(checkpoints)
    if absent:
        verb = "is" if len(absent) == 1 else "are"
        raise CheckpointError(
            f"{_named(absent)} {verb} not in the Hugging Face cache and HF_HUB_OFFLINE is set; run `{_commands(absent)}` "
            "with network access, or pass local directories."
        )


@dataclass
class Download:
    """What fetching one checkpoint means: its files and their bytes (None when the hub did not say)."""

    role: str
    repo: str
    files: list[str] = field(default_factory=list)
    bytes: Optional[int] = None


def plan(absent: dict[str, str]) -> list[Download]:
    """Ask the hub what each missing checkpoint would download (a metadata request, no weights)."""
    from huggingface_hub import snapshot_download

    planned = []
    for role, repo in absent.items():
        try:
            files = snapshot_download(repo, allow_patterns=CHECKPOINT_FILES, dry_run=True)
            todo = [f for f in files if f.will_download]
            sizes = [f.file_size for f in todo if f.file_size is not None]  # (None: the hub did not say)
            planned.append(Download(role, repo, [f.filename for f in todo], sum(sizes) if len(sizes) == len(todo) else None))
        except Exception as exc:  # unreachable, gated, no such repo
            raise CheckpointError(
                f"The {role} '{repo}' could not be looked up on the Hugging Face hub ({type(exc).__name__}); "
                f"run `hf download {repo}` where the hub is reachable, or pass a local directory."
            ) from None
    return planned


def refuse_without_terminal(absent: dict[str, str]) -> _CheckpointError:
    """The error for a download nobody can confirm (no terminal): what to run instead."""
    return CheckpointError(
        f"{_named(absent)} {'is' if len(absent) == 1 else 'are'} not downloaded yet and there is no terminal to "
        f"confirm the download; run `{_commands(absent)}` first, or rerun at a terminal."
    )


def fetch(downloads: list[Download], progress: Callable[[int, int], None]) -> None:
    """Download every planned file, calling `progress(bytes_done, bytes_total)` after each file."""
    from huggingface_hub import hf_hub_download

    total = sum(d.bytes or 0 for d in downloads)
    done = 0
    for d in downloads:
        for filename in d.files:
            try:
                path = hf_hub_download(d.repo, filename)
            except Exception as exc:
                raise CheckpointError(
                    f"Downloading {filename} of the {d.role} '{d.repo}' failed ({type(exc).__name__}); rerun to "
                    f"resume, or run `hf download {d.repo}`."
                ) from None
            done += os.path.getsize(path)
            progress(done, total)


def resolve(name: str, role: str) -> Path:
    """A local directory for a hub id: from the cache, else downloaded (unless offline)."""
    snapshot = cached(name)
    if snapshot is not None:
        return snapshot
    require_cached({role: name})
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(name, allow_patterns=CHECKPOINT_FILES))
    except Exception as exc:  # network down, repo missing, gated, ...
        raise CheckpointError(
            f"The {role} '{name}' could not be fetched from the Hugging Face hub ({type(exc).__name__}); "
            f"run `hf download {name}` where the hub is reachable, or pass a local directory."
        ) from None
