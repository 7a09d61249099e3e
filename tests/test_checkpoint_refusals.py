"""Issue 43, section 5: a bad checkpoint is refused before its weights load, in one sentence, with exit code 2
and nothing else on the terminal (no loader's report, no warning).

The rules live in engines/checkpoints.py (DraftInfo.read, TargetInfo.read, validate_pair: read from config
files and safetensors headers only); a refusal that can only come after loading (a tensor transformers finds
missing) holds transformers' output back (engines/cuda/target.py, held_library_output).
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from dflash_tui.cli import main
from tests import tiny, tiny_dflash2


def refused(capfd, *args) -> str:
    """The CLI's one-sentence refusal (exit 2) for `generate` on these checkpoints; nothing else printed, on
    its streams or on the process's file descriptors."""
    capfd.readouterr()  # (what building the fixtures printed)
    result = CliRunner().invoke(main, ["generate", *map(str, args), "--engine", "cuda", "--raw", "-n", "2", "hi"])
    leaked = capfd.readouterr()
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert not (leaked.out + leaked.err).strip(), leaked
    return lines[0]


def copy(folder: Path, out: Path, config=None, name="config.json") -> Path:
    shutil.copytree(folder, out)
    if config is not None:
        data = json.loads((out / name).read_text())
        config(data)
        (out / name).write_text(json.dumps(data))
    return out


def rewrite_header(file: Path, edit) -> None:
    """`edit` (header -> None) changes a safetensors file's JSON header in place; the data stays."""
    raw = file.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8: 8 + length])
    edit(header)
    text = json.dumps(header).encode()
    file.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + length:])


@pytest.fixture(scope="module")
def dflash2(pairs, tmp_path_factory):
    target, _ = pairs("qwen3")
    return tiny_dflash2.make_dflash2_draft(tmp_path_factory.mktemp("refusals") / "d2", target, [0, 2])


@pytest.mark.parametrize("edit,needle", [
    (lambda c: c.update(block_size=None), "block_size null"),
    (lambda c: c["dflash_config"].update(selector_top_k=10_000), "selector_top_k 10000, more candidates than"),
])
def test_dflash2_configs(pairs, dflash2, tmp_path, capfd, edit, needle):
    target, _ = pairs("qwen3")
    assert needle in refused(capfd, "--target", target, "--draft", copy(dflash2, tmp_path / "d", edit))


@pytest.mark.parametrize("edit,needle", [
    (lambda c: c.update(block_size=1), "block_size 1"),
    (lambda c: c.update(sliding_window=0), "sliding_window 0"),
    (lambda c: (c.update(layer_types=["sliding_attention", "full_attention"], sliding_window=4),
                c["dflash_config"].update(swa_window_size=-2)), "dflash_config.swa_window_size -2"),
])
def test_draft_configs(pairs, tmp_path, capfd, edit, needle):
    target, draft = pairs("qwen3")
    assert needle in refused(capfd, "--target", target, "--draft", copy(draft, tmp_path / "d", edit))


@pytest.mark.parametrize("count", [1, 20_000])
def test_extra_or_unknown_draft_tensors_from_the_header(pairs, tmp_path, capfd, count):
    """Zero-size tensors under names the draft does not have, added to the header (no byte of data): refused
    from the names alone, before any weight is read, however many there are."""
    target, draft = pairs("qwen3")
    folder = copy(draft, tmp_path / "d")
    rewrite_header(folder / "model.safetensors", lambda h: h.update(
        {f"extra.{i}.weight": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]} for i in range(count)}))
    line = refused(capfd, "--target", target, "--draft", folder)
    assert f"{count} tensor" in line and "extra." in line


@pytest.mark.parametrize("edit,needle", [
    (lambda c: c.update(rope_theta=float("nan")), "rope_theta NaN"),
    (lambda c: c.update(rope_scaling={"rope_type": "yarn", "factor": 0}), "rope_scaling.factor 0"),
    (lambda c: c.update(rope_scaling={"rope_type": "yarn", "factor": -2.0}), "rope_scaling.factor -2.0"),
    (lambda c: c.update(rope_scaling={"rope_type": "warp", "factor": 2.0}), "rope_scaling.rope_type \"warp\""),
    (lambda c: c.update(eos_token_id=10**6), "eos_token_id 1000000, outside the vocabulary"),
    (lambda c: c.update(quantization_config={"quant_method": "sparkle"}), "quant_method \"sparkle\""),
])
def test_target_configs(pairs, tmp_path, capfd, edit, needle):
    target, draft = pairs("qwen3")
    assert needle in refused(capfd, "--target", copy(target, tmp_path / "t", edit), "--draft", draft)


def test_target_generation_config_eos_outside_the_vocabulary(pairs, tmp_path, capfd):
    target, _ = pairs("qwen3")
    folder = copy(target, tmp_path / "t", lambda g: g.update(eos_token_id=[1, 99_999]), "generation_config.json")
    assert "eos_token_id 99999" in refused(capfd, "--target", folder)


@pytest.mark.parametrize("dtype,widen", [("I16", 2), ("C64", 0.5)])
def test_target_weights_relabelled_to_dtypes_no_weight_has(pairs, tmp_path, capfd, dtype, widen):
    """The embedding's F32 bytes relabelled (its shape adjusted so the byte span still fits)."""
    target, _ = pairs("qwen3")
    folder = copy(target, tmp_path / "t")

    def relabel(header):
        name = next(k for k in header if k.endswith("embed_tokens.weight"))
        rows, cols = header[name]["shape"]
        header[name].update(dtype=dtype, shape=[rows, int(cols * widen)])

    rewrite_header(folder / "model.safetensors", relabel)
    assert f"stored as {dtype}" in refused(capfd, "--target", folder)


@pytest.mark.parametrize("family", ["gpt_oss", "qwen3_next"])
def test_a_refusal_after_loading_prints_only_its_sentence(tmp_path, family):
    """A target missing a tensor is found missing by transformers' loader (the family's own key conversion
    decides the names); its load report is held back, so the refusal is the one line, in a fresh process
    where transformers' logging is as a user gets it."""
    from safetensors.torch import load_file, save_file

    target = tiny.make_target(tmp_path / "t", family)
    weights = load_file(str(target / "model.safetensors"))
    gone = sorted(k for k in weights if ".layers.1." in k)[0]
    save_file({k: v for k, v in weights.items() if k != gone}, str(target / "model.safetensors"))
    proc = subprocess.run([sys.executable, "-m", "dflash_tui", "generate", "--target", str(target), "--engine",
                           "cuda", "--raw", "-n", "2", "hi"], capture_output=True, text=True, timeout=300)
    out = (proc.stdout + proc.stderr).strip().splitlines()
    assert proc.returncode == 2 and len(out) == 1 and out[0].startswith("error: "), proc.stdout + proc.stderr
    assert "layers.1." in out[0]
