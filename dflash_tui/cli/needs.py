"""`dflash doctor --profile P`: what the profile's target needs from this machine, read from its config.json
(once downloaded): which installed framework runs its model type, and the family's parts that change what
loading and decoding cost (sliding windows, attention sinks, MXFP4 experts, linear-attention rollback,
mixture of experts, multimodal towers). docs/families.md says why each one matters. What the frameworks can do
is engines/frameworks.py's to say: torch and transformers are imported inside engines/ only."""

from __future__ import annotations

import json
from pathlib import Path

from dflash_tui.engines import frameworks
from dflash_tui.engines.checkpoints import safetensors_headers, text_config
from dflash_tui.engines.memory import TOWER_PREFIXES

MXFP4_SAID = {"no torch": "torch is not installed", "no CUDA device": "no CUDA device here, so they load dequantized",
              "packed": "kept packed here",
              "dequantized": "dequantized here (install Triton >= 3.4 and `kernels` to keep them packed)"}


def _framework(model_type: str) -> str:
    said = {True: "runs it", False: "does NOT run it", None: "not installed"}
    found = frameworks.runs(model_type)
    return f"model type {model_type}: transformers {said[found.transformers]}, mlx-lm {said[found.mlx_lm]}"


def target_needs(folder: Path) -> list[str]:
    """One line per need of the target in `folder` (a checkpoint with its config.json)."""
    config = json.loads((Path(folder) / "config.json").read_text())
    text = text_config(config)
    model_type = str(text.get("model_type") or config.get("model_type"))
    lines = [_framework(str(config.get("model_type") or model_type))]
    types = text.get("layer_types") or []
    window = text.get("sliding_window")
    if window and ("sliding_attention" in types or not types):
        lines.append(f"sliding window {window}: every position stays cached (exact rollback, kept turns), "
                     "attention reads the window")
    if model_type == "gpt_oss":
        lines.append("attention sinks (one learned logit per head)")
    quant = config.get("quantization_config") or text.get("quantization_config") or {}
    if isinstance(quant, dict) and quant.get("quant_method") == "mxfp4":
        lines.append(f"MXFP4 experts: {MXFP4_SAID[frameworks.mxfp4_experts()]}; mlx-lm keeps them packed")
    if "linear_attention" in types:
        lines.append(f"{types.count('linear_attention')} linear-attention layers: a rejected draft token is rolled "
                     "back by recomputing their states; CUDA graphs off")
    if "moe" in model_type or text.get("num_experts") or text.get("num_local_experts"):
        lines.append("mixture of experts: CUDA graphs off (expert routing syncs with the host)")
    towers = sum(1 for name in safetensors_headers(Path(folder)) if name.startswith(TOWER_PREFIXES))
    if towers:
        lines.append(f"{towers} vision/audio tower tensors: left out (neither built nor read)")
    return lines
