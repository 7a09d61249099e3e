"""Finding checkpoints and checking that a target and a draft belong together, before any weight loads.

A checkpoint is a local directory or a Hugging Face hub id resolved through the normal HF cache
(HF_HOME, HF_HUB_OFFLINE respected). Only safetensors and JSON/tokenizer files are read; code in a
checkpoint is never executed: `.py` files and `auto_map` entries are ignored (the public drafts ship
both), every transformers loader gets `trust_remote_code=False`, and pickled weights are refused
(docs/checkpoints.md).
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional, overload

from dflash_tui.engines import hub
from dflash_tui.engines.config import check_block_size_value
from dflash_tui.engines.errors import CheckpointError, UserError, describe, parse_json
from dflash_tui.engines.text import finite_number as _number
from dflash_tui.engines.text import printable

# Weight formats that are pickles (or other formats a loader could deserialize into code paths we do
# not control); a checkpoint that has only these is refused, and beside safetensors they are never read.
PICKLE_WEIGHTS = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
MAX_HEADER_BYTES = 100 * 2**20  # a safetensors header is JSON of names and shapes: megabytes at most


def _is_regular(path: Path) -> bool:
    """A regular file (links followed): a FIFO or a device named like a weights file would block or
    stream forever when opened."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def check_checkpoint_files(directory: Path, role: str) -> None:
    """Every file a loader may open (configs, weights, tokenizer and template files) is a regular file."""
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError as exc:
        raise CheckpointError(printable(f"The {role} folder {directory} cannot be read ({exc.strerror}); check its "
                                        "permissions.")) from None
    for entry in entries:
        if not any(fnmatch.fnmatch(entry.name, pattern) for pattern in hub.CHECKPOINT_FILES):
            continue
        try:
            mode = os.stat(entry.path).st_mode
        except OSError as exc:
            raise CheckpointError(printable(f"The {role}'s {entry.path} cannot be read ({exc.strerror}); re-download "
                                            "the checkpoint.")) from None
        if stat.S_ISDIR(mode):
            continue
        if not stat.S_ISREG(mode):
            raise CheckpointError(printable(f"The {role}'s {entry.path} is not a regular file (a pipe or a device); "
                                            "replace it with the checkpoint's file."))


def resolve_checkpoint(name: str, role: str) -> Path:
    """A local directory for `name` (a path or a hub id), or a CheckpointError saying how to get it. The
    path is absolute (links resolved): a session records it, and a relative one would not resume from another
    folder."""
    path = Path(name).expanduser()
    try:
        path = path.resolve()
    except (OSError, RuntimeError, ValueError):  # a link loop, a NUL byte: not a folder, said below
        pass
    if path.exists():
        if not path.is_dir():
            raise CheckpointError(printable(f"The {role} '{name}' is a file, not a folder; point at a Hugging Face "
                                            "model directory."))
        if not (path / "config.json").is_file():
            raise CheckpointError(printable(f"The {role} '{name}' has no config.json; point at a Hugging Face model "
                                            "directory."))
        check_checkpoint_files(path, role)
        return path
    if not hub.looks_like_hub_id(name):
        raise CheckpointError(printable(f"The {role} '{name}' is neither a directory nor a hub id like 'org/model'; "
                                        "check the path."))
    path = hub.resolve(name, role)
    check_checkpoint_files(path, role)
    return path


def read_json(path: Path, role: str) -> dict:
    if path.exists() and not _is_regular(path):
        raise CheckpointError(printable(f"The {role}'s {path} is not a regular file; replace it with the checkpoint's "
                                        "file."))
    try:
        value = parse_json(path.read_bytes())
    except (OSError, ValueError) as exc:  # ValueError: parse_json's reason (syntax, nesting, a huge integer, bytes)
        raise CheckpointError(printable(f"The {role}'s {path} cannot be read ({describe(exc)}); re-download the "
                                        "checkpoint.")) from None
    if not isinstance(value, dict):
        raise CheckpointError(printable(f"The {role}'s {path} holds a JSON {type(value).__name__}, not an object; "
                                        "re-download the checkpoint."))
    return value


def check_weight_format(directory: Path, role: str) -> None:
    """Refuse a checkpoint whose weights are not safetensors, before any loader sees it.

    Pickled weights (`pytorch_model.bin`, `*.pt`) can run code when unpickled. Beside safetensors
    files they are simply never read (loaders get `use_safetensors=True`), and a weight index
    (`*.safetensors.index.json`, which loaders follow) may name only safetensors files of the folder."""
    for index in sorted(directory.glob("*.safetensors.index.json")):
        check_weight_index(index, role)
    if any(directory.glob("*.safetensors")):
        return
    pickles = sorted(p.name for p in directory.iterdir() if p.suffix in PICKLE_WEIGHTS)
    if pickles:
        raise CheckpointError(printable(
            f"The {role} {directory} has its weights only as {', '.join(pickles[:3])} (pickle files, which can run "
            "code when loaded); dflash reads safetensors only: use a safetensors build of the model, or convert it "
            "yourself where you trust the file."
        ))
    raise CheckpointError(printable(f"The {role} {directory} has no *.safetensors weights; re-download it or point at "
                                    "the model folder."))


def check_weight_index(index: Path, role: str) -> None:
    """A weight index names, for every tensor, a safetensors file in its own folder: never a pickle, a
    file elsewhere, or one that is missing."""
    weight_map = read_json(index, role).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(printable(f"The {role}'s {index} has no weight_map of tensor names to files; "
                                        "re-download the checkpoint."))
    for file in sorted({str(v) for v in weight_map.values()}):
        where = index.parent / file
        if not file.endswith(".safetensors") or Path(file).name != file:
            raise CheckpointError(printable(
                f"The {role}'s {index} points its weights at {file!r}, which is not a safetensors file beside it "
                "(pickles are never opened); re-download the checkpoint or use a safetensors build."))
        if not _is_regular(where):
            raise CheckpointError(printable(f"The {role}'s {index} names {file}, which is missing (or not a regular "
                                            "file); re-download the checkpoint."))


# Bits per element of every safetensors dtype; a draft's tensors must be floating point.
DTYPE_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16, "F16": 16,
              "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "F64": 64, "I64": 64, "U64": 64, "C64": 64, "F4": 4,
              "F6_E2M3": 6, "F6_E3M2": 6}
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")


def _check_tensors(header: dict, data_size: int, bad: str, floats_only: bool) -> None:
    """What the safetensors loader checks, said first and in one sentence: known dtypes, byte spans that
    match each shape, one after another from 0 to the end of the file, none past it."""
    spans = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype, offsets = entry.get("dtype"), entry.get("data_offsets")
        if dtype not in DTYPE_BITS:
            raise CheckpointError(f"{bad} (tensor {name!r} has the unknown dtype {dtype!r}); re-download it.")
        if floats_only and dtype not in FLOAT_DTYPES:
            raise CheckpointError(f"{bad} for a draft (tensor {name!r} is {dtype}, not floating point); re-export "
                                  "the draft in float32, float16 or bfloat16.")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(
                isinstance(o, int) and not isinstance(o, bool) for o in offsets) and 0 <= offsets[0] <= offsets[1]):
            raise CheckpointError(f"{bad} (tensor {name!r} has no valid data_offsets); re-download it.")
        bits = math.prod(entry["shape"]) * DTYPE_BITS[dtype]
        if offsets[1] - offsets[0] != (bits + 7) // 8:
            raise CheckpointError(f"{bad} (tensor {name!r} spans {offsets[1] - offsets[0]} bytes where its shape "
                                  f"{entry['shape']} in {dtype} needs {(bits + 7) // 8}); re-download it.")
        spans.append((offsets[0], offsets[1], name))
    spans.sort()
    end = 0
    for start, stop, name in spans:
        if start < end:
            raise CheckpointError(f"{bad} (tensor {name!r} overlaps the one before it); re-download it.")
        if start > end:
            raise CheckpointError(f"{bad} ({start - end} bytes before tensor {name!r} belong to no tensor); "
                                  "re-download it.")
        end = stop
    if end > data_size:
        raise CheckpointError(f"{bad} (it is truncated: its tensors need {end - data_size} bytes more than the file "
                              "holds); re-download it.")
    if end < data_size:
        raise CheckpointError(f"{bad} ({data_size - end} bytes at its end belong to no tensor); re-download it.")


def safetensors_header(file: Path, role: str = "checkpoint", floats_only: bool = False) -> dict:
    """The JSON header of one safetensors file (names, dtypes, shapes, offsets), checked for sanity: every
    tensor's bytes lie within the file, none overlaps another, every dtype is known (and floating point
    with `floats_only`), so the loader never meets a torn or hostile file."""
    bad = printable(f"The {role}'s {file} is not a valid safetensors file")
    if not _is_regular(file):
        raise CheckpointError(printable(f"The {role}'s {file} is not a regular file (a pipe, a device or a broken "
                                        "link); replace it with the checkpoint's weights."))
    try:
        size = file.stat().st_size
        with open(file, "rb") as fh:
            raw = fh.read(8)
            if len(raw) < 8:
                raise CheckpointError(f"{bad} (it is {size} bytes long); re-download it.")
            (length,) = struct.unpack("<Q", raw)
            if length > min(size - 8, MAX_HEADER_BYTES):
                raise CheckpointError(f"{bad} (its header claims {length} bytes in a {size}-byte file); re-download it.")
            header = parse_json(fh.read(length))
    except OSError as exc:
        raise CheckpointError(printable(f"The {role}'s {file} cannot be read ({exc}); check its permissions or "
                                        "re-download it.")) from None
    except ValueError:
        raise CheckpointError(f"{bad} (its header is not JSON); re-download it.") from None
    if not isinstance(header, dict) or not all(
            isinstance(v, dict) and isinstance(v.get("shape"), list) and all(
                isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in v["shape"])
            for k, v in header.items() if k != "__metadata__"):
        raise CheckpointError(f"{bad} (its header does not list tensors with shapes); re-download it.")
    metadata = header.get("__metadata__", {})
    if not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise CheckpointError(f"{bad} (its __metadata__ is not an object of strings); re-download it.")
    _check_tensors(header, size - 8 - length, bad, floats_only)
    return header


def safetensors_headers(directory: Path, role: str = "checkpoint", floats_only: bool = False) -> dict[str, dict]:
    """Tensor name -> its header entry (dtype, shape, offsets) for every safetensors file in `directory`."""
    entries: dict[str, dict] = {}
    for file in sorted(directory.glob("*.safetensors")):
        header = safetensors_header(file, role, floats_only)
        entries.update({k: v for k, v in header.items() if k != "__metadata__"})
    return entries


def safetensors_shapes(directory: Path, role: str = "checkpoint") -> dict[str, list[int]]:
    """Tensor name -> shape for every safetensors file in `directory`, read from headers only."""
    return {k: v["shape"] for k, v in safetensors_headers(directory, role).items()}


# Shape fields the loaders read besides the ones kept on TargetInfo/DraftInfo: checked here so that a
# wrong type is one sentence naming the key, not a loader's multi-line validation error.
SHAPE_FIELDS = ("num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size")


def _check_shape_fields(config: dict, where: str) -> None:
    for key in SHAPE_FIELDS:
        _int_field(config, key, where, required=key == "num_attention_heads")
    eos = config.get("eos_token_id")
    if eos is not None and not (isinstance(eos, int) and not isinstance(eos, bool) or
                                isinstance(eos, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in eos)):
        raise CheckpointError(f"{where} has eos_token_id {eos!r}, not a token id or a list of them; re-download the checkpoint.")


def stored_bytes(directory: Path, role: str = "checkpoint") -> int:
    """Bytes of every tensor in the safetensors files of `directory`, as stored (headers only)."""
    total = 0
    for file in sorted(Path(directory).glob("*.safetensors")):
        for name, entry in safetensors_header(file, role).items():
            if name != "__metadata__":
                count = 1
                for n in entry["shape"]:
                    count *= n
                total += (count * DTYPE_BITS.get(str(entry.get("dtype")), 16) + 7) // 8
    return total


@overload
def _int_field(config: dict, key: str, where: str, required: Literal[True] = True) -> int: ...
@overload
def _int_field(config: dict, key: str, where: str, required: bool) -> Optional[int]: ...
def _int_field(config: dict, key: str, where: str, required: bool = True) -> Optional[int]:
    """A positive integer config value, or one sentence naming the key and the file."""
    value = config.get(key)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        shown = "missing" if value is None else f"{value!r}"
        raise CheckpointError(f"{where} has {key} {shown}, not a positive integer; re-download or re-export the checkpoint.")
    return value




def _token_ids(value) -> bool:
    ids = value if isinstance(value, list) else [value]
    return all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids)


# generation_config.json values the engines read: (key, check, what it must be)
GENERATION_FIELDS = (
    ("temperature", lambda v: _number(v) and v >= 0, "a number of at least 0"),
    ("top_p", lambda v: _number(v) and 0 < v <= 1, "a number above 0 and at most 1"),
    ("top_k", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "a whole number of at least 0"),
    ("min_p", lambda v: _number(v) and 0 <= v < 1, "a number from 0 up to 1"),
    ("do_sample", lambda v: isinstance(v, bool), "true or false"),
    ("eos_token_id", _token_ids, "a token id or a list of them"),
)


def check_target_weights(info: "TargetInfo", entries: dict[str, dict]) -> None:
    """The embedding (and an untied lm_head) in the safetensors headers have the shape config.json implies:
    a config that disagrees with its weights is one sentence here, not transformers' mismatch table after
    loading. Quantized checkpoints (packed integer weights) are left to their loader. Every target family
    names its token embedding *embed_tokens.weight: a folder without one (a DFlash draft named as the
    target, say) is refused here, before a loader fills the gap with random weights and a table."""
    if not any(n.endswith("embed_tokens.weight") for n in entries):
        draft = "fc.weight" in entries and "hidden_norm.weight" in entries
        raise CheckpointError(printable(
            f"The target {info.path} has no token embedding (no tensor named *embed_tokens.weight); "
            + ("it is a DFlash draft: pass it as the draft and name its target." if draft
               else "it is not a language model's checkpoint, name the target's folder or hub id.")))
    config, text = info.config, text_config(info.config)
    if config.get("quantization") or config.get("quantization_config") or text.get("quantization_config"):
        return
    expected = [info.vocab_size, info.hidden_size]
    for suffix in ("embed_tokens.weight", "lm_head.weight"):
        names = sorted((n for n in entries if n.endswith(suffix) and not n.startswith(("mtp", "visual", "model.visual"))
                        and "vision" not in n), key=len)
        if not names or entries[names[0]].get("dtype") not in FLOAT_DTYPES:
            continue
        found = list(entries[names[0]]["shape"])
        if found != expected:
            raise CheckpointError(printable(
                f"The target {info.path} has {names[0]} of shape {found} where its config.json implies {expected} "
                "(vocab_size x hidden_size); the config and the weights disagree, re-download the checkpoint."))


def text_config(config: dict) -> dict:
    """The language-model part of a config (vision-language checkpoints nest it under text_config)."""
    return config.get("text_config", config)


@dataclass
class TargetInfo:
    path: Path
    model_type: str
    hidden_size: int
    num_layers: int
    vocab_size: int
    max_positions: Optional[int]
    config: dict

    @classmethod
    def read(cls, name: str) -> "TargetInfo":
        path = resolve_checkpoint(name, "target")
        config = read_json(path / "config.json", "target")
        text = text_config(config)
        where = printable(f"The target {path}/config.json")
        if not isinstance(text, dict):
            raise CheckpointError(f"{where} has a text_config that is not an object; re-download the checkpoint.")
        if "hidden_size" not in text or "num_hidden_layers" not in text:
            raise CheckpointError(f"{where} has no hidden_size or num_hidden_layers; it is not a causal language model.")
        _check_shape_fields(text, where)
        model_type = config.get("model_type", text.get("model_type", "?"))
        if not isinstance(model_type, str) or printable(model_type) != model_type or "\n" in model_type:
            raise CheckpointError(f"{where} has model_type {model_type!r}, not a name; re-download the checkpoint.")
        if text.get("use_bidirectional_attention") in (True, "all"):  # an embedding model (EmbeddingGemma, Gemma 4's)
            raise CheckpointError(f"{where} attends bidirectionally over every token (use_bidirectional_attention "
                                  f"{json.dumps(text['use_bidirectional_attention'])}): it is an embedding model and "
                                  "cannot generate text; name a causal language model.")
        info = cls(
            path=path, model_type=model_type,
            hidden_size=_int_field(text, "hidden_size", where),
            num_layers=_int_field(text, "num_hidden_layers", where),
            vocab_size=_int_field(text, "vocab_size", where),
            max_positions=_int_field(text, "max_position_embeddings", where, required=False),
            config=config,
        )
        check_weight_format(path, "target")
        check_target_config(info, where)
        entries = safetensors_headers(path, "target")  # a torn or hostile header is refused before any loader reads it
        check_target_dtypes(info, entries)
        check_target_weights(info, entries)
        return info

    def generation_config(self) -> dict:
        """The target's generation_config.json, its sampling values checked (a loader would fail on them later)."""
        file = self.path / "generation_config.json"
        if not file.exists():
            return {}
        values = read_json(file, "target")
        for key, ok, what in GENERATION_FIELDS:
            value = values.get(key)
            if value is not None and not ok(value):
                raise CheckpointError(printable(f"The target's {file} has {key} {json.dumps(value)[:40]}, not {what}; "
                                                "fix the value or re-download the file."))
        return values

    def stop_ids(self) -> list[int]:
        """Every eos id the generation_config names (falling back to config.json)."""
        for source in (self.generation_config(), text_config(self.config), self.config):
            eos = source.get("eos_token_id")
            if eos is not None:
                return [eos] if isinstance(eos, int) else list(eos)
        return []


@dataclass
class DraftInfo:
    path: Path
    hidden_size: int
    num_layers: int
    vocab_size: int
    block_size: int
    num_target_layers: Optional[int]
    target_layer_ids: list[int]
    mask_token_id: int
    fc_in_features: int
    config: dict
    weight_shapes: dict[str, list[int]] = field(default_factory=dict)  # from the safetensors headers
    arch: str = "dflash"  # or "dflash2": a candidate selector and dynamic convolutions (docs/dflash2.md)
    causal: list[bool] = field(default_factory=list)  # per layer, inside the block (resolve_causal)
    embedding_scale: float = 1.0  # input_embedding_scale: the block's input embeddings are multiplied by it
    selector_top_k: Optional[int] = None  # DFlash 2: candidates per mask slot
    conv_taps: Optional[int] = None
    conv_groups: Optional[int] = None
    selector_dim: Optional[int] = None
    logit_multiplier: float = 1.0  # dflash_config.output_multiplier / final_logit_softcapping: applied to the
    logit_softcap: Optional[float] = None  # selector's top-K values of the raw target-head logits (vLLM's order)

    @classmethod
    def read(cls, name: str) -> "DraftInfo":
        path = resolve_checkpoint(name, "draft")
        config = read_json(path / "config.json", "draft")
        dflash = config.get("dflash_config")
        if not isinstance(dflash, dict):
            raise CheckpointError(printable(
                f"The draft '{name}' is not a DFlash draft (its config.json has no dflash_config); "
                "pass a DFlash draft checkpoint such as z-lab/Qwen3-8B-DFlash-b16 as the draft."
            ))
        where = printable(f"The draft {path}/config.json")
        ids, mask = draft_layer_ids(config, where), dflash.get("mask_token_id", config.get("mask_token_id"))
        if isinstance(mask, bool) or not isinstance(mask, int) or mask < 0:
            raise CheckpointError(f"{where} has no dflash_config.mask_token_id (a token id); re-export the draft.")
        # what the engines build from: the values read, where vLLM reads them, kept in dflash_config
        config = {**config, "dflash_config": {**dflash, "target_layer_ids": ids, "mask_token_id": mask}}
        dflash = config["dflash_config"]
        _check_shape_fields(config, where)
        _check_rope_and_norm(config, where)
        names = config.get("architectures")
        if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
            raise CheckpointError(f"{where} has architectures {json.dumps(names)[:40]}, not a list of class names; "
                                  "re-export the draft.")
        _int_field(config, "num_key_value_heads", where)
        hidden = _int_field(config, "hidden_size", where)
        layers = _int_field(config, "num_hidden_layers", where)
        types = config.get("layer_types")
        if types is not None and (not isinstance(types, list) or len(types) != layers
                                  or not all(t in ("full_attention", "sliding_attention") for t in types)):
            raise CheckpointError(f"{where} has layer_types {types!r}, not one full_attention or sliding_attention "
                                  f"per layer ({layers}); re-export the draft.")
        check_window_keys(config, where)
        check_runnable(config, where)
        check_weight_format(path, "draft")
        entries = safetensors_headers(path, "draft", floats_only=True)  # int, bool or unknown dtypes: refused here
        shapes = {k.removeprefix("model."): v["shape"] for k, v in entries.items()}
        fc = shapes.get("fc.weight")
        if fc is None or len(fc) != 2:
            raise CheckpointError(printable(f"The draft '{name}' has no 2-D fc.weight in its safetensors files; it is "
                                            "incomplete or not a DFlash draft."))
        declared = _int_field(config, "target_hidden_size", where, required=False)  # vLLM sizes the fc by it
        if declared is not None and declared * len(ids) != fc[1]:
            raise CheckpointError(printable(
                f"The draft {path} has fc.weight of shape {list(fc)} but its target_hidden_size {declared} x "
                f"{len(ids)} target layers implies {declared * len(ids)} columns; the config and the weights "
                "disagree, re-export the draft."))
        info = cls(
            path=path,
            hidden_size=hidden,
            num_layers=layers,
            vocab_size=_int_field(config, "vocab_size", where, required=False) or 0,
            block_size=draft_block_size(config, where),
            num_target_layers=_int_field(config, "num_target_layers", where, required=False),
            target_layer_ids=list(ids),
            mask_token_id=int(dflash["mask_token_id"]),
            fc_in_features=fc[1],
            config=config,
            weight_shapes=shapes,
            causal=resolve_causal(config, where),
        )
        info.embedding_scale, info.logit_multiplier, info.logit_softcap = head_settings(config, where)
        _read_dflash2(info, dflash, where)
        if info.arch != "dflash2":
            info.embedding_scale = 1.0  # vLLM's DFlash 1 model never reads input_embedding_scale
        check_draft_tensor_names(info)
        return info


    @property
    def dflash2(self) -> Optional["Dflash2Dims"]:
        """The selector and convolution sizes of a DFlash 2 draft (None for DFlash 1)."""
        taps, groups, dim, top_k = self.conv_taps, self.conv_groups, self.selector_dim, self.selector_top_k
        if self.arch != "dflash2" or taps is None or groups is None or dim is None or top_k is None:
            return None  # (a DFlash 2 draft has all four: _read_dflash2)
        return Dflash2Dims(taps, groups, dim, top_k)


@dataclass(frozen=True)
class Dflash2Dims:
    """What a DFlash 2 draft's extra modules are built with (docs/dflash2.md)."""
    taps: int
    groups: int
    selector_dim: int
    top_k: int


DFLASH2_ARCH = "DFlash2DraftModel"
SELECTOR = ("candidate_selector.hidden_projection.weight", "candidate_selector.predecessor_codebook",
            "candidate_selector.successor_codebook")


def draft_layer_ids(config: dict, where: str) -> list[int]:
    """The target layers the draft reads, in vLLM's order (`get_eagle3_aux_layers_from_config`): a non-empty
    top-level `eagle_aux_hidden_state_layer_ids` (hidden-state indices: layer id + 1), else
    dflash_config.target_layer_ids. Distinct layer numbers of 0 or more."""
    eagle = config.get("eagle_aux_hidden_state_layer_ids")
    name = "eagle_aux_hidden_state_layer_ids" if eagle else "dflash_config.target_layer_ids"
    ids = eagle if eagle else (config.get("dflash_config") or {}).get("target_layer_ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise CheckpointError(f"{where} has no {name} list; re-export the draft.")
    ids = [i - 1 for i in ids] if eagle else list(ids)
    if any(i < 0 for i in ids) or len(set(ids)) != len(ids):
        shown = [i + 1 for i in ids] if eagle else ids
        raise CheckpointError(f"{where} has {name} {shown}, not distinct layer numbers of "
                              f"{1 if eagle else 0} or more; re-export the draft.")
    return ids


def head_settings(config: dict, where: str = "The draft's config.json") -> tuple[float, float, Optional[float]]:
    """(input_embedding_scale, output_multiplier, final_logit_softcapping) read as vLLM's DFlash 2 model reads
    them: from dflash_config only (a top-level key of the same name is not read, and the target's values are
    never borrowed); a softcap of 0 or null means none. Scales must be positive numbers."""
    dflash = config.get("dflash_config") or {}
    values: list[Optional[float]] = []
    for key in ("input_embedding_scale", "output_multiplier", "final_logit_softcapping"):
        value = dflash.get(key)
        if value is None or (key == "final_logit_softcapping" and _number(value) and value == 0):
            values.append(None)
            continue
        if not (_number(value) and value > 0):
            raise CheckpointError(f"{where} has dflash_config.{key} {json.dumps(value)[:40]}, not a positive number; "
                                  "re-export the draft.")
        values.append(float(value))
    return values[0] or 1.0, values[1] or 1.0, values[2]


def resolve_causal(config: dict, where: str = "The draft's config.json") -> list[bool]:
    """Whether each draft layer is causal inside the block, resolved as vLLM's `_dflash_layer_causal`: a
    top-level `is_causal`, then `dflash_config.causal`; otherwise a layer is causal when `layer_types` names
    it sliding_attention (`dflash_config.use_swa` does not make a layer causal, and `dflash_config.is_causal`
    is not read). docs/dflash2.md."""
    dflash = config.get("dflash_config") or {}
    for holder, key, name in ((config, "is_causal", "is_causal"), (dflash, "causal", "dflash_config.causal")):
        value = holder.get(key)
        if value is None:
            continue
        if not isinstance(value, bool):
            raise CheckpointError(f"{where} has {name} {json.dumps(value)[:40]}, not true or false; re-export the draft.")
        return [value] * config["num_hidden_layers"]
    types = config.get("layer_types")
    return [bool(types) and t == "sliding_attention" for t in (types or [None] * config["num_hidden_layers"])]


def draft_block_size(config: dict, where: str) -> int:
    """The draft's trained block size: top-level `block_size` (z-lab's loader and SGLang), else
    `dflash_config.block_size` (which llama.cpp and z-lab read first); 16 when neither is set. Both set and
    different, null, or below 2 is refused: a block of one token drafts nothing."""
    dflash = config.get("dflash_config") or {}
    found = [(name, holder[key]) for name, holder, key in (("block_size", config, "block_size"),
                                                              ("dflash_config.block_size", dflash, "block_size"))
             if key in holder]
    for name, value in found:
        if isinstance(value, bool) or not isinstance(value, int) or value < 2:
            raise CheckpointError(f"{where} has {name} {json.dumps(value)[:40]}, not a whole number of at least 2 "
                                  "(the mask slots plus the anchor); re-export the draft.")
    if len({v for _, v in found}) > 1:
        raise CheckpointError(f"{where} has block_size {found[0][1]} but dflash_config.block_size {found[1][1]}, "
                              "which public readers would each take; set both to the trained block size.")
    return found[0][1] if found else 16


def check_window_keys(config: dict, where: str) -> None:
    """`sliding_window` and `dflash_config.swa_window_size`, when set, are positive integers; `use_swa` is true
    or false; a layer that layer_windows makes sliding has a window (vLLM's `_resolve_layer_attention`)."""
    dflash = config.get("dflash_config") or {}
    for name, holder, key in (("sliding_window", config, "sliding_window"),
                              ("dflash_config.swa_window_size", dflash, "swa_window_size")):
        value = holder.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise CheckpointError(f"{where} has {name} {json.dumps(value)[:40]}, not a positive number of positions; "
                                  "re-export the draft.")
    if not isinstance(dflash.get("use_swa", False), bool):
        raise CheckpointError(f"{where} has dflash_config.use_swa {json.dumps(dflash['use_swa'])[:40]}, not true or "
                              "false; re-export the draft.")
    if any(sliding for sliding in _sliding_layers(config)) and _window(config) is None:
        raise CheckpointError(f"{where} has sliding-attention layers but no window (dflash_config.swa_window_size or "
                              "sliding_window); re-export the draft.")


def check_runnable(config: dict, where: str) -> None:
    """Keys vLLM reads that would make it run the draft differently from dflash's one way (neox rotary, the
    fc over target features, SiLU MLPs, no attention sinks): anything else is refused, never ignored."""
    dflash = config.get("dflash_config") or {}
    for key, value, what in (("is_neox_style", config.get("is_neox_style", True), True),
                             ("use_aux_hidden_state",
                              dflash.get("use_aux_hidden_state", config.get("use_aux_hidden_state", True)), True),
                             ("hidden_act", config.get("hidden_act", "silu"), "silu")):
        if value != what or isinstance(value, bool) != isinstance(what, bool):
            raise CheckpointError(printable(f"{where} has {key} {json.dumps(value)[:40]}; dflash runs drafts with "
                                            f"{key} {json.dumps(what)} only."))
    sink = dflash.get("attention_sink_bias", config.get("add_swa_attention_sink_bias", False))
    if sink:
        raise CheckpointError(f"{where} asks for attention sink biases (attention_sink_bias), which dflash's draft "
                              "layers do not have; use a draft without them.")


def _read_dflash2(info: DraftInfo, dflash: dict, where: str) -> None:
    """DFlash 2 is declared by the architecture or by `selector_top_k`, and carried by the selector and the
    convolution tensors: either without the other is refused, so a DFlash 2 head never runs as DFlash 1."""
    config, shapes = info.config, info.weight_shapes
    declared = (DFLASH2_ARCH in (config.get("architectures") or []) or "selector_top_k" in dflash
                or "conv_kernel_size" in dflash)  # (llama.cpp's converter takes the latter as the mark)
    carried = [k for k in shapes if k.startswith("candidate_selector.") or ".attention_conv." in k or ".mlp_conv." in k]
    if not declared:
        if carried:
            raise CheckpointError(printable(
                f"The draft {info.path} carries DFlash 2 tensors ({carried[0]}) but its config.json declares a "
                f"DFlash 1 draft; set architectures to [\"{DFLASH2_ARCH}\"] and dflash_config.selector_top_k, "
                "or re-export the draft."))
        return
    info.arch = "dflash2"
    top_k = dflash.get("selector_top_k")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k <= 0:
        raise CheckpointError(f"{where} declares a DFlash 2 draft but has dflash_config.selector_top_k "
                              f"{json.dumps(top_k)[:40]}, not a positive integer; re-export the draft.")
    info.selector_top_k = top_k
    for name in (*SELECTOR, "layers.0.attention_conv.base_kernel", "layers.0.attention_conv.kernel_projection.weight"):
        if name not in shapes:
            raise CheckpointError(printable(
                f"The draft {info.path} declares a DFlash 2 draft but has no tensor {name}; the checkpoint is "
                "incomplete or not a DFlash 2 draft, re-download it."))
    sizes = {}
    for key in DFLASH2_SIZES:  # vLLM, llama.cpp and z-lab index all four: a draft without one loads nowhere else
        value = dflash.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise CheckpointError(f"{where} declares a DFlash 2 draft but has dflash_config.{key} "
                                  f"{json.dumps(value)[:40]}, not a positive integer; add it (the size its tensors "
                                  "have) or re-export the draft.")
        sizes[key] = value
    taps, group_size, rank = sizes["conv_kernel_size"], sizes["conv_group_size"], sizes["selector_rank"]
    if info.hidden_size % group_size:
        raise CheckpointError(f"{where} has dflash_config.conv_group_size {group_size}, which does not divide its "
                              f"hidden size {info.hidden_size}; re-export the draft.")
    groups = info.hidden_size // group_size
    for name, expected, key in (
            ("layers.0.attention_conv.base_kernel", [2, taps, info.hidden_size], "conv_kernel_size"),
            ("layers.0.attention_conv.kernel_projection.weight", [2 * taps * groups, info.hidden_size],
             "conv_kernel_size and conv_group_size"),
            (SELECTOR[0], [rank, info.hidden_size], "selector_rank")):
        if list(shapes[name]) != expected:
            raise CheckpointError(printable(
                f"The draft {info.path} has {name} of shape {list(shapes[name])} but its dflash_config.{key} "
                f"implies {expected}; the config and the weights disagree, re-export the draft."))
    info.conv_taps, info.conv_groups, info.selector_dim = taps, groups, rank


DFLASH2_SIZES = ("selector_top_k", "conv_kernel_size", "conv_group_size", "selector_rank")


def dflash2_config(config: dict, dims: "Dflash2Dims") -> dict:
    """`config` (a DFlash 1 draft config from draft_config) as a DFlash 2 draft's: the architecture and every
    size the public readers index (vLLM, llama.cpp's converter and z-lab's loader read all four)."""
    config = {**config, "architectures": [DFLASH2_ARCH], "dflash_config": {**config["dflash_config"]}}
    config["dflash_config"].update(selector_top_k=dims.top_k, conv_kernel_size=dims.taps,
                                   conv_group_size=config["hidden_size"] // dims.groups, selector_rank=dims.selector_dim)
    return config


ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")
ROPE_NEEDS = {"linear": ("factor",), "dynamic": ("factor",), "yarn": ("factor",),  # what each type cannot do without
              "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
              "longrope": ("short_factor", "long_factor")}
ROPE_NUMBERS = ("factor", "beta_fast", "beta_slow", "low_freq_factor", "high_freq_factor", "attention_factor",
                "mscale", "mscale_all_dim", "partial_rotary_factor", "rope_theta")


TARGET_ROPE_TYPES = (*ROPE_TYPES, "proportional", "mrope")  # transformers' rope functions (+ the old mrope name)


def _check_rope_and_norm(config: dict, where: str, fix: str = "re-export the draft",
                         types: tuple[str, ...] = ROPE_TYPES) -> None:
    """Rope and norm settings are what the rotary embedding and RMSNorm take: positive finite numbers, a known
    rope type, an integer original context. One sentence naming the key, never a loader's ValueError or
    KeyError (or its load report). A target's rope_parameters may hold one section per layer type."""
    def fail(key: str, value, what: str) -> CheckpointError:
        return CheckpointError(f"{where} has {key} {json.dumps(value)[:40]}, not {what}; {fix}.")

    for key in ("rope_theta", "rms_norm_eps"):
        value = config.get(key)
        if value is not None and not (_number(value) and value > 0):
            raise fail(key, value, "a positive number")
    eps = config.get("rms_norm_eps")
    if eps is not None and eps >= 1:
        raise fail("rms_norm_eps", eps, "a small positive number (such as 1e-6)")
    for section in ("rope_scaling", "rope_parameters"):
        scaling = config.get(section)
        if scaling is None:
            continue
        if not isinstance(scaling, dict):
            raise fail(section, scaling, "an object")
        nested = [(f"{section}.{k}", v) for k, v in scaling.items() if k in ("full_attention", "sliding_attention",
                                                                               "linear_attention", "chunked_attention")]
        for name, part in nested or [(section, scaling)]:
            if not isinstance(part, dict):
                raise fail(name, part, "an object")
            _check_rope_section(part, name, fail, types)


def _check_rope_section(scaling: dict, section: str, fail, types: tuple[str, ...]) -> None:
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in types:
        raise fail(f"{section}.rope_type", kind, f"one of {', '.join(types)}")
    for key in ROPE_NUMBERS:
        value = scaling.get(key)
        if value is not None and not (_number(value) and value > 0):
            raise fail(f"{section}.{key}", value, "a positive number")
    original = scaling.get("original_max_position_embeddings")
    if original is not None and (isinstance(original, bool) or not isinstance(original, int) or original <= 0):
        raise fail(f"{section}.original_max_position_embeddings", original, "a positive integer")
    for key in ("short_factor", "long_factor"):
        value = scaling.get(key)
        if value is not None and not (isinstance(value, list) and all(_number(v) for v in value)):
            raise fail(f"{section}.{key}", value, "a list of numbers")
    for key in ROPE_NEEDS.get(kind, ()):
        if scaling.get(key) is None:
            raise fail(f"{section}.{key}", None, f"set (rope type {kind} needs it)")


# quantization_config.quant_method values transformers has a quantizer for (5.x); anything else is refused
QUANT_METHODS = ("aqlm", "auto-round", "awq", "bitnet", "bitsandbytes", "bitsandbytes_4bit", "bitsandbytes_8bit",
                 "compressed-tensors", "eetq", "fbgemm_fp8", "fouroversix", "fp8", "fp_quant", "gemma", "gguf", "gptq",
                 "higgs", "hqq", "metal", "mxfp4", "mxfp8", "nvfp4", "quanto", "quark", "sinq", "spqr", "torchao", "vptq")
NEVER_WEIGHT_DTYPES = ("C64", "I16", "U16", "U64", "BOOL")  # no model family or quantizer stores weights so


def check_target_config(info: "TargetInfo", where: str) -> None:
    """What transformers and mlx-lm would otherwise refuse only while loading (under their load report), or
    run wrongly: rope and norm settings, eos ids inside the vocabulary, a known quantization method."""
    config, text = info.config, text_config(info.config)
    fix = "fix the value or re-download the checkpoint"
    _check_rope_and_norm(text, where, fix, TARGET_ROPE_TYPES)
    for source, name in ((text, "eos_token_id"), (info.generation_config(), "generation_config.json eos_token_id")):
        eos = source.get("eos_token_id")
        ids = eos if isinstance(eos, list) else [eos] if eos is not None else []
        bad = [i for i in ids if isinstance(i, int) and not 0 <= i < info.vocab_size]
        if bad:
            raise CheckpointError(f"{where} has {name} {bad[0]}, outside the vocabulary of {info.vocab_size} tokens; "
                                  f"{fix}.")
    for quant in (config.get("quantization_config"), text.get("quantization_config")):
        if quant is None:
            continue
        method = quant.get("quant_method") if isinstance(quant, dict) else quant
        if isinstance(quant, dict) and method is None:
            continue  # (mlx-community's configs: bits and group_size, read by mlx-lm)
        if method not in QUANT_METHODS:
            raise CheckpointError(printable(f"{where} has quantization_config.quant_method {json.dumps(method)[:40]}, "
                                            "which no loader dflash uses knows; use an unquantized or a "
                                            "transformers-quantized build of the model."))


def check_target_dtypes(info: "TargetInfo", entries: dict[str, dict]) -> None:
    """Weights are floating point unless the config names a quantization (its packed integers); complex and
    16-bit integer dtypes never hold weights. From the safetensors headers, before any loader reads them."""
    config, text = info.config, text_config(info.config)
    quantized = bool(config.get("quantization") or config.get("quantization_config")
                     or text.get("quantization_config"))
    for name, entry in entries.items():
        dtype = entry.get("dtype")
        if dtype in NEVER_WEIGHT_DTYPES or (not quantized and dtype not in FLOAT_DTYPES):
            raise CheckpointError(printable(
                f"The target {info.path} has tensor {name[:80]!r} stored as {dtype}, which "
                + ("no model weight is" if dtype in NEVER_WEIGHT_DTYPES else "an unquantized model's weights are not")
                + "; re-download the checkpoint."))


def _sliding_layers(cfg: dict) -> list[bool]:
    """Which draft layers use sliding-window attention, as vLLM's `_resolve_layer_attention`: with no
    `layer_types`, or with `dflash_config.use_swa` and no sliding layer in them, every layer is sliding exactly
    when use_swa is true; otherwise the layers `layer_types` names sliding_attention."""
    dflash = cfg.get("dflash_config") or {}
    types, use_swa = cfg.get("layer_types"), dflash.get("use_swa", False) is True
    if types is None or (use_swa and "sliding_attention" not in types):
        return [use_swa] * cfg["num_hidden_layers"]
    return [t == "sliding_attention" for t in types]


def _window(cfg: dict) -> Optional[int]:
    """A sliding layer's window: dflash_config.swa_window_size when the key is there, else sliding_window."""
    dflash = cfg.get("dflash_config") or {}
    return dflash["swa_window_size"] if "swa_window_size" in dflash else cfg.get("sliding_window")


def layer_windows(cfg: dict) -> list[Optional[int]]:
    """The trained sliding window of each draft layer (None for full attention), resolved as vLLM does."""
    window = _window(cfg)
    return [window if sliding else None for sliding in _sliding_layers(cfg)]


def attention_window(draft_window: Optional[int], trained: Optional[int]) -> Optional[int]:
    """How many recent context positions a draft layer's block attends to: the tighter of the configured
    draft window and the layer's trained sliding window (None: all of them). Both engines use this."""
    windows = [w for w in (draft_window, trained) if w]
    return min(windows) if windows else None


def draft_weight_shapes(config: dict, fc_in: int) -> dict[str, list[int]]:
    """Every tensor a draft in the public DFlash layout must have, with the shape its config implies."""
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    kv, head_dim = config["num_key_value_heads"], config.get("head_dim") or hidden // heads
    inter = config.get("intermediate_size") or 4 * hidden
    shapes = {"fc.weight": [hidden, fc_in], "hidden_norm.weight": [hidden], "norm.weight": [hidden]}
    for n in range(config["num_hidden_layers"]):
        at, mlp = f"layers.{n}.self_attn", f"layers.{n}.mlp"
        shapes.update({
            f"{at}.q_proj.weight": [heads * head_dim, hidden], f"{at}.k_proj.weight": [kv * head_dim, hidden],
            f"{at}.v_proj.weight": [kv * head_dim, hidden], f"{at}.o_proj.weight": [hidden, heads * head_dim],
            f"{at}.q_norm.weight": [head_dim], f"{at}.k_norm.weight": [head_dim],
            f"{mlp}.gate_proj.weight": [inter, hidden], f"{mlp}.up_proj.weight": [inter, hidden],
            f"{mlp}.down_proj.weight": [hidden, inter],
            f"layers.{n}.input_layernorm.weight": [hidden], f"layers.{n}.post_attention_layernorm.weight": [hidden],
        })
    return shapes


def dflash2_weight_shapes(info: DraftInfo, vocab: int) -> dict[str, list[int]]:
    """The convolution and selector tensors of a DFlash 2 draft, with the shapes its first layer and the
    target's vocabulary (the codebooks have one row per token) imply."""
    dims = info.dflash2
    if dims is None:  # DFlash 1: no such tensors
        return {}
    hidden, taps, groups, dim = info.hidden_size, dims.taps, dims.groups, dims.selector_dim
    shapes = {SELECTOR[0]: [dim, hidden], SELECTOR[1]: [vocab, dim], SELECTOR[2]: [vocab, dim]}
    for n in range(info.num_layers):
        for side in ("attention_conv", "mlp_conv"):
            shapes[f"layers.{n}.{side}.base_kernel"] = [2, taps, hidden]
            shapes[f"layers.{n}.{side}.kernel_projection.weight"] = [2 * taps * groups, hidden]
    return shapes


# Tensors a public draft may carry that dflash does not read: the draft shares the target's embeddings and head.
UNREAD_DRAFT_TENSORS = ("embed_tokens.weight", "lm_head.weight")


def check_draft_tensor_names(info: "DraftInfo") -> None:
    """Every tensor of the draft is one its config implies (or one of UNREAD_DRAFT_TENSORS): an extra or unknown
    tensor, zero-sized or not, is refused from the safetensors headers, before any weight is read."""
    config = info.config
    expected = set(draft_weight_shapes(config, info.fc_in_features)) | set(UNREAD_DRAFT_TENSORS)
    if info.arch == "dflash2":
        expected |= set(SELECTOR)
        expected |= {f"layers.{n}.{side}.{part}" for n in range(info.num_layers) for side in ("attention_conv", "mlp_conv")
                     for part in ("base_kernel", "kernel_projection.weight")}
    if config.get("attention_bias"):
        expected |= {f"layers.{n}.self_attn.{p}_proj.bias" for n in range(info.num_layers) for p in "qkvo"}
    unknown = [name for name in info.weight_shapes if name not in expected]
    if unknown:
        raise CheckpointError(printable(
            f"The draft {info.path} has {len(unknown)} tensor{'s' if len(unknown) > 1 else ''} its config.json does "
            f"not describe (such as {sorted(unknown)[0][:80]!r}); it is not a {'DFlash 2' if info.arch == 'dflash2' else 'DFlash 1'}"
            " draft of this shape, re-export it."))


def check_draft_weights(config: dict, shapes: dict[str, list[int]], fc_in: int, path: Path,
                        extra: Optional[dict[str, list[int]]] = None) -> None:
    """The draft's tensors match its config.json (extra tensors are ignored), named in one sentence."""
    for name, expected in {**draft_weight_shapes(config, fc_in), **(extra or {})}.items():
        found = shapes.get(name)
        if found is None:
            raise CheckpointError(f"The draft {path} has no tensor {name}; the checkpoint is incomplete, re-download it.")
        if list(found) != expected:
            raise CheckpointError(
                f"The draft {path} has {name} of shape {list(found)} but its config.json implies {expected}; "
                "the config and the weights disagree, re-export the draft."
            )


def check_block_size(block_size: int, trained: Optional[int], has_draft: bool) -> list[str]:
    """Raise on an impossible block size; return warnings for a questionable one."""
    check_block_size_value(block_size, "for this run")
    if block_size > 1 and not has_draft:
        raise UserError(f"Block size {block_size} needs a draft model; pass --draft or use a profile with one, or use block size 1.")
    if trained and block_size > trained:
        return [f"Block size {block_size} is above the draft's trained block size {trained}; acceptance usually drops beyond it."]
    return []


def validate_pair(target: TargetInfo, draft: DraftInfo, profile_layer_ids: Optional[list[int]] = None,
                  source: str = "the profile") -> None:
    """Every check that can fail before weights load, each with its own sentence."""
    where = f"draft {draft.path}"
    if draft.hidden_size != target.hidden_size:
        raise CheckpointError(
            f"The {where} has hidden size {draft.hidden_size} but the target has {target.hidden_size}; "
            "use the draft trained for this target."
        )
    if draft.vocab_size and draft.vocab_size != target.vocab_size:
        raise CheckpointError(
            f"The {where} has vocab size {draft.vocab_size} but the target has {target.vocab_size}; "
            "use the draft trained for this target."
        )
    own = draft.config.get("draft_vocab_size")
    if own is not None and own != target.vocab_size:  # vLLM would map a smaller draft vocabulary (d2t); we do not
        raise CheckpointError(
            f"The {where} declares draft_vocab_size {json.dumps(own)[:20]} but the target has {target.vocab_size} "
            "tokens; dflash runs drafts over the target's whole vocabulary, use one trained that way."
        )
    if draft.num_target_layers and draft.num_target_layers != target.num_layers:
        raise CheckpointError(
            f"The {where} was trained on a {draft.num_target_layers}-layer target but this target has "
            f"{target.num_layers} layers; use the draft trained for this target."
        )
    bad = [i for i in draft.target_layer_ids if not 0 <= i < target.num_layers]
    if bad:
        raise CheckpointError(
            f"The {where} reads target layers {bad}, which a {target.num_layers}-layer target does not have; "
            "use the draft trained for this target."
        )
    expected = len(draft.target_layer_ids) * target.hidden_size
    if draft.fc_in_features is not None and draft.fc_in_features != expected:
        raise CheckpointError(
            f"The {where} has fc width {draft.fc_in_features}, but {len(draft.target_layer_ids)} target layers x "
            f"hidden {target.hidden_size} = {expected}; the draft's config.json and weights disagree, re-export it."
        )
    if profile_layer_ids is not None and list(profile_layer_ids) != draft.target_layer_ids:
        raise CheckpointError(
            f"target_layer_ids {list(profile_layer_ids)} in {source} differ from the draft's own "
            f"{draft.target_layer_ids}; remove the key or copy the draft's values."
        )
    if not 0 <= draft.mask_token_id < target.vocab_size:
        raise CheckpointError(
            f"The {where} uses mask token id {draft.mask_token_id}, outside the target's {target.vocab_size} "
            "embedding rows; use the draft trained for this target."
        )
    if draft.selector_top_k is not None and draft.selector_top_k > target.vocab_size:
        raise CheckpointError(
            f"The {where} has dflash_config.selector_top_k {draft.selector_top_k}, more candidates than the "
            f"target's {target.vocab_size} tokens; re-export the draft with a smaller selector_top_k.")
    check_draft_weights(draft.config, draft.weight_shapes, draft.fc_in_features, draft.path,
                        dflash2_weight_shapes(draft, target.vocab_size) if draft.arch == "dflash2" else None)


def default_target_layer_ids(num_target_layers: int, num_ids: int) -> list[int]:
    """Layer ids spread between layer 1 and L-3 like the public drafts; never the last layer, and
    distinct even on small targets (clamped into [0, L-2])."""
    if num_target_layers < 2:
        raise UserError(f"A {num_target_layers}-layer target is too shallow for a DFlash draft; it needs at least 2 layers.")
    hi = max(min(num_target_layers - 3, num_target_layers - 2), 0)
    lo = min(1, hi)
    count = min(num_ids, num_target_layers - 1)
    if count == 1:
        return [(lo + hi) // 2 if hi > lo else lo]
    ids = sorted({round(lo + i * (hi - lo) / (count - 1)) for i in range(count)})
    pool = [i for i in range(num_target_layers - 1) if i not in ids]
    while len(ids) < count:  # too few layers between lo and hi: borrow the nearest free ones
        ids = sorted(ids + [min(pool, key=lambda j: abs(j - (lo + hi) / 2))])
        pool = [i for i in pool if i not in ids]
    return ids


def draft_config(target_config: dict, num_layers: int, target_layer_ids: list[int], block_size: int,
                 mask_token_id: int, **overrides) -> dict:
    """A draft config.json in the public DFlash layout, with the keys the public loaders read: the
    `DFlashDraftModel` architecture (vLLM's and SGLang's registries), the Qwen3 shape fields, `rope_theta`,
    `block_size`, `num_target_layers`, `dflash_config.{target_layer_ids, mask_token_id}` and one
    `layer_types` entry per layer (full attention = non-causal in vLLM and SGLang). train-draft adds
    `dflash_config.mask_token` when saving (README "Which loaders read a trained draft")."""
    text = text_config(target_config)
    hidden, heads = text["hidden_size"], text["num_attention_heads"]
    config = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": hidden,
        "intermediate_size": text.get("intermediate_size", 4 * hidden),
        "num_hidden_layers": num_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": text.get("num_key_value_heads", heads),
        "head_dim": text.get("head_dim") or hidden // heads,
        "hidden_act": "silu",
        "rms_norm_eps": text.get("rms_norm_eps", 1e-6),
        "rope_theta": text.get("rope_theta", (text.get("rope_parameters") or {}).get("rope_theta", 1e6)),
        "max_position_embeddings": text.get("max_position_embeddings", 32768),
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "vocab_size": text["vocab_size"],
        "block_size": block_size,
        "num_target_layers": text["num_hidden_layers"],
        "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": list(target_layer_ids),
                          "block_size": block_size},
        "layer_types": ["full_attention"] * num_layers,
        "torch_dtype": "float32",
    }
    config.update(overrides)
    return config
