"""The target model through mlx-lm's own loader, with context features captured at the draft's layers.

mlx-lm runs every family it supports with its own model code (masks, caches, quantized layers). To take
layer outputs without re-implementing each family, the decoder layers the draft reads are wrapped in a
`Tap` that records the layer's output as the model iterates its own `layers` list; for the last layer the
tap sits on the final norm instead, because drafts are trained on transformers' `hidden_states`, whose
last entry is post-norm (NOTES.md). Only these layers are captured, never all hidden states.
"""

from __future__ import annotations

import copy
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from ..checkpoints import TargetInfo
from ..errors import CheckpointError, UserError

NORM_NAMES = ("norm", "final_layernorm", "ln_f", "norm_f", "final_norm")
EMBED_NAMES = ("embed_tokens", "wte", "tok_embeddings", "word_embeddings")
DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


class Tap:
    """Stands in for a module in the model's tree and records its output while `store.active`."""

    def __init__(self, module, store: "Capture", key: int):
        self._module, self._store, self._key = module, store, key

    def __call__(self, *args, **kwargs):
        out = self._module(*args, **kwargs)
        if self._store.active:
            self._store.values[self._key] = out[0] if isinstance(out, tuple) else out
        return out

    def __getattr__(self, name):  # the model may read attributes of its layers (is_linear, use_sliding, ...)
        return getattr(self._module, name)


class Capture:
    def __init__(self):
        self.active = False
        self.values: dict[int, mx.array] = {}


COMMON_TYPES = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "qwen3_5", "qwen3_next", "gemma3_text", "gpt_oss")


def _supported_types() -> str:
    """'N model types, among them ...' for the mlx-lm installed here."""
    import pkgutil

    import mlx_lm.models

    helpers = {"base", "cache", "rope_utils", "activations", "switch_layers", "ssm", "gated_delta", "pipeline",
               "mla", "bitlinear_layers", "gear"}
    names = {m.name for m in pkgutil.iter_modules(mlx_lm.models.__path__)} - helpers
    known = [t for t in COMMON_TYPES if t in names]
    return f"about {len(names)} model types, among them {', '.join(known)}"


def _mlx_lm_version() -> str:
    from mlx_lm import __version__

    return __version__


def legacy_keys(config: dict) -> dict:
    """Config keys mlx-lm's model args read under their transformers 4.x names, for checkpoints saved by
    transformers 5.x (rope_parameters, num_local_experts); keys already present are left alone."""
    extra: dict = {}
    rope = config.get("rope_parameters")
    if isinstance(rope, dict):
        if config.get("rope_theta") is None and rope.get("rope_theta") is not None:
            extra["rope_theta"] = rope["rope_theta"]
        if config.get("rope_scaling") is None and rope.get("rope_type", "default") != "default":
            extra["rope_scaling"] = rope
    if config.get("num_experts") is None and config.get("num_local_experts") is not None:
        extra["num_experts"] = config["num_local_experts"]
    return extra


def load_mlx_model(path: Path, model_type: str, config: dict):
    from mlx_lm.utils import load_model

    try:
        model, _ = load_model(Path(path), model_config=legacy_keys(config))
    except ValueError as exc:
        if "not supported" in str(exc):
            raise UserError(
                f"The target {path} is a '{model_type}' model, which mlx-lm {_mlx_lm_version()} does not run; "
                f"it has {_supported_types()} (upgrade mlx-lm, or use --engine cuda)."
            ) from None
        raise CheckpointError(f"The target {path} could not be loaded by mlx-lm ({exc}); re-download it or convert it with mlx_lm.convert.") from None
    except (FileNotFoundError, KeyError, TypeError) as exc:
        raise CheckpointError(
            f"The target {path} could not be loaded by mlx-lm ({type(exc).__name__}: {exc}); re-download it."
        ) from None
    return model


def _decoder(model: nn.Module) -> nn.Module:
    """The module that owns the model's decoder layer list (model.model for most families)."""
    layers = model.layers
    for _, module in model.named_modules():
        if isinstance(module, nn.Module) and "layers" in module and module["layers"] is layers and module is not model:
            return module
    return model.model


def _first(module, names):
    for name in names:
        if name in module:
            return name
    return None


class Target:
    def __init__(self, info: TargetInfo, dtype: str, layer_ids: list[int]):
        self.model = load_mlx_model(info.path, info.model_type, info.config)
        if dtype != "auto":
            self.model.set_dtype(DTYPES[dtype])
        decoder = _decoder(self.model)
        embed_name = _first(decoder, EMBED_NAMES)
        if embed_name is None:
            raise UserError(f"The target {info.path} has no token embedding the MLX engine can share with a draft.")
        self.embed = decoder[embed_name]
        lm_head = next((m for name, m in self.model.named_modules() if name.split(".")[-1] == "lm_head"), None)
        self.lm_head = lm_head if lm_head is not None else self.embed.as_linear
        self.dtype = self.embed(mx.array([[0]])).dtype  # the activations' dtype (a quantized model's scales)
        self.layer_ids = list(layer_ids)
        self.capture = Capture()
        layers = decoder["layers"] if "layers" in decoder else self.model.layers
        last = len(layers) - 1
        for i in self.layer_ids:
            if i == last:
                norm_name = _first(decoder, NORM_NAMES)
                if norm_name is None:
                    raise UserError(f"The draft reads the last layer of {info.path}, whose final norm the MLX engine cannot find.")
                decoder[norm_name] = Tap(decoder[norm_name], self.capture, i)
            else:
                layers[i] = Tap(layers[i], self.capture, i)

    def make_cache(self) -> list:
        from mlx_lm.models.cache import make_prompt_cache

        return make_prompt_cache(self.model)

    def forward(self, ids: mx.array, cache: list, capture: bool):
        """Logits [1, n, vocab] for ids [1, n] after the cache's contents and, if asked, the concatenated
        context features [1, n, len(layer_ids) * hidden]. Both lazy."""
        self.capture.active = capture
        try:
            logits = self.model(ids, cache=cache)
        finally:
            self.capture.active = False
        features = None
        if capture:
            values = self.capture.values
            features = mx.concatenate([values.pop(i) for i in self.layer_ids], axis=-1)
        return logits, features


class CacheRollback:
    """Puts the target cache back to 'every committed token except the newest' after a verify pass.

    Plain KV caches are trimmed. Caches that cannot be trimmed exactly (recurrent/conv states of gated
    delta nets, rotating windows) are snapshotted before the verify pass; after a partial acceptance they
    are restored, the KV caches are trimmed back to the block's start, and the k+1 committed tokens of the
    block are fed again (DESIGN.md, invariant 3).
    """

    def __init__(self, cache: list):
        from mlx_lm.models.cache import ArraysCache, KVCache, QuantizedKVCache

        self.cache = cache
        self._plain = [type(c) in (KVCache, QuantizedKVCache) for c in cache]
        self._arrays = ArraysCache
        self.exact = all(self._plain)
        self._saved: list = []

    def snapshot(self) -> None:
        if self.exact:
            return
        self._saved = []
        for c, plain in zip(self.cache, self._plain):
            if plain:
                self._saved.append(None)
            elif isinstance(c, self._arrays):
                self._saved.append(list(c.cache))  # MLX arrays are immutable; entries are rebound, not written
            else:
                self._saved.append(copy.deepcopy(c))

    def rollback(self, fed: int, keep: int, refeed) -> None:
        """`fed` tokens went through the verify pass; keep the first `keep` of them in the cache."""
        drop = fed - keep
        if drop <= 0:
            return
        if self.exact:
            for c in self.cache:
                c.trim(drop)
            return
        for i, (c, saved) in enumerate(zip(self.cache, self._saved)):
            if saved is None:
                c.trim(fed)
            elif isinstance(c, self._arrays):
                c.cache = saved
            else:
                self.cache[i] = saved
        refeed(keep)


def dtype_name(dtype: mx.Dtype) -> str:
    return str(dtype).removeprefix("mlx.core.")
