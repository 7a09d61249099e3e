"""The target model through mlx-lm's own loader, with context features captured at the draft's layers.

mlx-lm runs every family it supports with its own model code (masks, caches, quantized layers). To take
layer outputs without re-implementing each family, the decoder layers the draft reads are wrapped in a
`Tap` that records the layer's output as the model iterates its own `layers` list; for the last layer the
tap sits on the final norm instead, because drafts are trained on transformers' `hidden_states`, whose
last entry is post-norm (NOTES.md). Only these layers are captured, never all hidden states.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Optional, Union

import mlx.core as mx
import mlx.nn as nn

from dflash_tui.engines.checkpoints import TargetInfo, text_config
from dflash_tui.engines.errors import CheckpointError, UserError, describe

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


COMMON_TYPES = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "qwen3_5", "qwen3_next", "gemma3_text", "gemma4", "gpt_oss")


def mlx_model_types() -> set[str]:
    """The model types the installed mlx-lm has a module for (its remapped aliases included)."""
    import pkgutil

    import mlx_lm.models
    from mlx_lm import utils

    helpers = {"base", "cache", "rope_utils", "activations", "switch_layers", "ssm", "gated_delta", "pipeline",
               "mla", "bitlinear_layers", "gear"}
    names = {m.name for m in pkgutil.iter_modules(mlx_lm.models.__path__)} - helpers
    remapped = getattr(utils, "MODEL_REMAPPING", {})
    return names | {alias for alias, real in remapped.items() if real in names}


def _supported_types() -> str:
    """'N model types, among them ...' for the mlx-lm installed here."""
    names = mlx_model_types()
    known = [t for t in COMMON_TYPES if t in names]
    return f"about {len(names)} model types, among them {', '.join(known)}"


def check_target(info: TargetInfo) -> None:
    """Refuse a model type mlx-lm has no module for, before any loader (or tokenizer) sees the folder."""
    if info.model_type not in mlx_model_types():
        raise UserError(
            f"The target {info.path} is a '{info.model_type}' model, which mlx-lm {_mlx_lm_version()} does not run; "
            f"it has {_supported_types()} (upgrade mlx-lm, or use --engine cuda)."
        )


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
        if config.get("partial_rotary_factor") is None and rope.get("partial_rotary_factor") is not None:
            extra["partial_rotary_factor"] = rope["partial_rotary_factor"]  # qwen3_next reads it at the top
    if config.get("num_experts") is None and config.get("num_local_experts") is not None:
        extra["num_experts"] = config["num_local_experts"]
    return extra


def gemma4_keys(config: dict) -> dict:
    """A Gemma 4 wrapper's config as mlx-lm 0.32 reads it: the text model's vocabulary size at the top (mlx-lm
    takes the wrapper's own, 262,144 by default, over the text config's), and the global layers' head size and
    K/V heads under their published names (`global_head_dim`, `num_global_key_value_heads`) where transformers 5
    saved them as `per_layer_config`. A config already in the published form is left alone."""
    text = dict(config.get("text_config") or {})
    extra: dict = {}
    if config.get("vocab_size") is None and text.get("vocab_size") is not None:
        extra["vocab_size"] = text["vocab_size"]
    types = text.get("layer_types") or []
    overrides = [(text.get("per_layer_config") or {}).get(str(i)) or {} for i, t in enumerate(types) if t == "full_attention"]
    if overrides and text.get("global_head_dim") is None:
        if overrides[0].get("head_dim"):
            text["global_head_dim"] = overrides[0]["head_dim"]
        if overrides[0].get("num_key_value_heads"):
            text["num_global_key_value_heads"] = overrides[0]["num_key_value_heads"]
        extra["text_config"] = text
    return extra


CONFIG_FIRST = {"gemma4": gemma4_keys}  # config keys translated for mlx-lm per family, beside legacy_keys


EXPERT_KEY = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def fuse_experts(weights: dict) -> dict:
    """Per-expert MoE weights (`mlp.experts.N.{gate,up,down}_proj.weight`, as transformers 5.x saves a
    Qwen3.5-MoE model) in the fused layout of the published checkpoints (`mlp.experts.gate_up_proj`
    [experts, 2 * inter, hidden], `mlp.experts.down_proj` [experts, hidden, inter]), the only one mlx-lm
    0.32's qwen3_5_moe reads. Other keys, and checkpoints already fused, are left alone."""
    found: dict[str, dict[str, dict[int, mx.array]]] = {}
    for key in list(weights):
        m = EXPERT_KEY.match(key)
        if m:
            found.setdefault(m[1], {}).setdefault(m[3], {})[int(m[2])] = weights.pop(key)
    for prefix, parts in found.items():
        stack = {name: mx.stack([ws[e] for e in sorted(ws)]) for name, ws in parts.items()}
        weights[f"{prefix}.gate_up_proj"] = mx.concatenate([stack["gate_proj"], stack["up_proj"]], axis=-2)
        weights[f"{prefix}.down_proj"] = stack["down_proj"]
    return weights


GPT_OSS_EXPERTS = re.compile(r"^(.*\.mlp\.experts)\.gate_up_proj$")


def split_gpt_oss_experts(weights: dict) -> dict:
    """gpt-oss expert weights as transformers holds and saves them unquantized (`mlp.experts.gate_up_proj`
    [experts, hidden, 2 * inter] with gate and up interleaved along the last axis, `down_proj` [experts,
    inter, hidden], and their `_bias` tensors) in the layout mlx-lm 0.32's gpt_oss runs: separate
    `gate_proj` / `up_proj` / `down_proj` `.weight` [experts, out, in] and `.bias`. mlx-lm's own sanitize
    reads only the published MXFP4 tensors (`*_blocks`, output rows first) and leaves the names of
    unquantized ones unloadable; MXFP4 checkpoints and mlx-lm's converted ones pass through untouched."""
    for key in [k for k in weights if GPT_OSS_EXPERTS.match(k)]:
        prefix = key.removesuffix(".gate_up_proj")
        gate_up = mx.swapaxes(weights.pop(key), -1, -2)  # [experts, 2 * inter, hidden]
        weights[f"{prefix}.gate_proj.weight"] = mx.contiguous(gate_up[..., ::2, :])
        weights[f"{prefix}.up_proj.weight"] = mx.contiguous(gate_up[..., 1::2, :])
        bias = weights.pop(f"{prefix}.gate_up_proj_bias")
        weights[f"{prefix}.gate_proj.bias"] = mx.contiguous(bias[..., ::2])
        weights[f"{prefix}.up_proj.bias"] = mx.contiguous(bias[..., 1::2])
        weights[f"{prefix}.down_proj.weight"] = mx.contiguous(mx.swapaxes(weights.pop(f"{prefix}.down_proj"), -1, -2))
        weights[f"{prefix}.down_proj.bias"] = weights.pop(f"{prefix}.down_proj_bias")
    return weights


# mlx-lm's sanitize fixed up for layouts transformers 5 saves and mlx-lm 0.32 does not read
SANITIZE_FIRST = {"qwen3_5_moe": fuse_experts, "gpt_oss": split_gpt_oss_experts}


def _model_classes(config: dict):
    """mlx-lm's own classes for the config; for the families in SANITIZE_FIRST, a subclass whose sanitize
    first translates the weights (fuse_experts, split_gpt_oss_experts) and then runs mlx-lm's own."""
    import inspect

    from mlx_lm.utils import load_model

    model_class, args_class = inspect.signature(load_model).parameters["get_model_classes"].default(config)
    translate = SANITIZE_FIRST.get(config.get("model_type") or "")
    if translate is None:
        return model_class, args_class

    class Translated(model_class):  # type: ignore[misc, valid-type]  # (mlx-lm picks the class at run time)
        def sanitize(self, weights):
            return super().sanitize(translate(dict(weights)))

    return Translated, args_class


def load_mlx_model(path: Path, model_type: str, config: dict):
    from mlx_lm.utils import load_model

    try:
        translate = CONFIG_FIRST.get(model_type)
        extra = {**legacy_keys(config), **(translate(config) if translate else {})}
        model, _ = load_model(Path(path), model_config=extra, get_model_classes=_model_classes)
    except ValueError as exc:
        if "not supported" in str(exc):
            raise UserError(
                f"The target {path} is a '{model_type}' model, which mlx-lm {_mlx_lm_version()} does not run; "
                f"it has {_supported_types()} (upgrade mlx-lm, or use --engine cuda)."
            ) from None
        raise CheckpointError(f"The target {path} could not be loaded by mlx-lm ({describe(exc)}); re-download it or convert "
                              "it with mlx_lm.convert.") from None
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


# Families whose sliding-window layers the engine keeps in plain (whole) KV caches rather than mlx-lm's
# rotating ones, as the cuda engine keeps them in whole buckets (docs/families.md): a verify block is then
# rolled back by a trim, not by re-feeding the whole target, and kept turns crop exactly. Only families whose
# mlx-lm model passes its window to the cache's mask (`create_attention_mask(..., window_size=W)`: a plain
# cache then builds the windowed causal mask over every position) belong here.
WHOLE_SLIDING = {"gpt_oss", "gemma4"}


def embedding_scale(model_type: str, config: dict) -> Optional[float]:
    """What the draft's input embeddings are scaled by. transformers' Gemma models (gemma, gemma2, gemma3,
    gemma3n, gemma4) return the token embeddings times sqrt(hidden) from their embedding module, which is what
    a draft trained on transformers reads; mlx-lm's scale inside the model's forward instead, so the engine
    scales what it hands the draft. None: the embeddings as they are."""
    if not model_type.startswith("gemma"):
        return None
    return float(text_config(config)["hidden_size"]) ** 0.5


class ScaledEmbedding:
    """The target's token embedding times `scale`, the scale rounded to the embeddings' dtype first, as
    transformers' scaled embedding modules do."""

    def __init__(self, embedding, scale: float):
        self.embedding, self.scale = embedding, scale

    def __call__(self, ids: mx.array) -> mx.array:
        h = self.embedding(ids)
        return h * mx.array(self.scale, h.dtype)


class Target:
    def __init__(self, info: TargetInfo, dtype: str, layer_ids: list[int]):
        self.model = load_mlx_model(info.path, info.model_type, info.config)
        self.model_type = info.model_type
        if dtype != "auto":
            self.model.set_dtype(DTYPES[dtype])
        decoder = _decoder(self.model)
        embed_name = _first(decoder, EMBED_NAMES)
        if embed_name is None:
            raise UserError(f"The target {info.path} has no token embedding the MLX engine can share with a draft.")
        self.embed = decoder[embed_name]
        lm_head = next((m for name, m in self.model.named_modules() if name.split(".")[-1] == "lm_head"), None)
        self.lm_head = lm_head if lm_head is not None else self.embed.as_linear
        scale = embedding_scale(info.model_type, info.config)
        if scale is not None:
            self.embed = ScaledEmbedding(self.embed, scale)
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
        self.mixer_capture = MixerCapture()
        self.mixers = tap_mixers(self.model, self.mixer_capture)

    def rollback_for(self, cache: list, recompute: bool = True) -> "CacheRollback":
        """The rollback for `cache`: recomputing linear-attention states where it can (`recompute`
        False forces the whole-target re-feed, for comparisons)."""
        if recompute:
            return CacheRollback(cache, self.mixers, self.mixer_capture)
        return CacheRollback(cache)

    def make_cache(self) -> list:
        """mlx-lm's prompt cache for the model, except that a family in WHOLE_SLIDING keeps its sliding-window
        layers in plain KV caches instead of window-sized rotating ones (see WHOLE_SLIDING)."""
        from mlx_lm.models.cache import KVCache, RotatingKVCache, make_prompt_cache

        cache = make_prompt_cache(self.model)
        if self.model_type in WHOLE_SLIDING:
            cache = [KVCache() if type(c) is RotatingKVCache else c for c in cache]
        return cache

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


class MixerTap:
    """Stands in for a linear-attention mixer (gated delta net) as its decoder layer's attribute and
    records the mixer's input (and mask) while `store.active`. It is set as a plain instance attribute,
    so the layer's module tree (parameters, dtype casts) still holds the mixer itself."""

    def __init__(self, module, store: "MixerCapture", key: int):
        self.module, self._store, self._key = module, store, key

    def __call__(self, inputs, mask=None, cache=None):
        if self._store.active:
            self._store.values[self._key] = (inputs, mask)
        return self.module(inputs, mask, cache)

    def __getattr__(self, name):
        return getattr(self.module, name)


class MixerCapture:
    def __init__(self):
        self.active = False
        self.values: dict[int, tuple] = {}


def tap_mixers(model: nn.Module, store: MixerCapture) -> dict[int, nn.Module]:
    """Wraps every decoder layer's `linear_attn` (Qwen3.5/3.6, Qwen3-Next, OLMo-hybrid gated delta nets:
    called as mixer(inputs, mask, cache), all of its state in the layer's ArraysCache) in a MixerTap.
    Returns {layer index: the mixer module}, indexed as the model's cache list."""
    mixers = {}
    for i, layer in enumerate(model.layers):
        module = layer._module if isinstance(layer, Tap) else layer
        mixer = module.get("linear_attn") if isinstance(module, nn.Module) else None
        if isinstance(mixer, nn.Module):
            object.__setattr__(module, "linear_attn", MixerTap(mixer, store, i))
            mixers[i] = mixer
    return mixers


class CacheRollback:
    """Puts the target cache back to 'every committed token except the newest' after a verify pass
    (docs/engine-contract.md, invariant 3). Three ways, chosen once from the cache's types:

    - "trim": every layer has a plain KV cache; each is trimmed by the tokens not kept.
    - "mixers": hybrid targets (Qwen3.5/3.6 and other gated-delta-net models with a `linear_attn`
      mixer): plain KV caches are trimmed; each linear-attention layer's ArraysCache entries (conv and
      recurrent state) from before the verify pass are kept (MLX arrays are immutable, so keeping the
      references is the snapshot), the mixer's input is captured during the pass, and after a partial
      acceptance the entries are restored and only the mixer is run again over the kept positions, with
      mlx-lm's own module. By causality those inputs are what a pass over the kept tokens alone would
      have fed the mixer, so the states equal that pass's (up to the float rounding of a b-row vs a
      k-row pass in earlier layers); MLPs and attention are not re-run. The recompute is lazy and is
      evaluated with the next step's graph, so a step still has one host sync.
    - "refeed": the fallback for caches that can be neither trimmed nor recomputed this way (Gemma-3's
      RotatingKVCache once it wraps, recurrent layers without a `linear_attn` mixer such as Mamba):
      the non-KV caches are snapshotted before the pass; after a partial acceptance they are restored,
      the KV caches are trimmed back to the block's start and the kept tokens are fed again through the
      whole target.
    """

    def __init__(self, cache: list, mixers: Optional[dict] = None, capture: Optional[MixerCapture] = None):
        from mlx_lm.models.cache import ArraysCache, KVCache, QuantizedKVCache

        self.cache = cache
        self._plain = [type(c) in (KVCache, QuantizedKVCache) for c in cache]
        self._arrays = ArraysCache
        mixers = mixers or {}
        recomputable = [i in mixers and isinstance(c, ArraysCache) for i, c in enumerate(cache)]
        if all(self._plain):
            self.mode = "trim"
        elif capture is not None and all(p or r for p, r in zip(self._plain, recomputable)):
            self.mode = "mixers"
        else:
            self.mode = "refeed"
        self.mixers = {i: mixers[i] for i, r in enumerate(recomputable) if r} if self.mode == "mixers" else {}
        self._capture = capture if capture is not None else MixerCapture()  # (one nothing writes: no mixers)
        # "mixers": {layer: its ArraysCache entries}; "refeed": per layer None, the entries or a copy
        self._saved: Union[list, dict[int, list]] = []

    def snapshot(self, fed: int = 2) -> None:
        """Before a verify pass of `fed` tokens (nothing is kept for a 1-token pass: it is never cut)."""
        if self.mode == "trim" or fed < 2:
            self._saved = []
            return
        if self.mode == "mixers":
            self._saved = {i: list(self.cache[i].cache) for i in self.mixers}
            self._capture.values.clear()
            self._capture.active = True
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
        """`fed` tokens went through the verify pass; keep the first `keep` of them in the cache.
        `refeed(keep)` feeds the kept tokens again (used only by the "refeed" fallback)."""
        self._capture.active = False
        drop = fed - keep
        if drop <= 0:
            self._release()
            return
        if self.mode == "trim":
            for c in self.cache:
                c.trim(drop)
        elif self.mode == "mixers":
            for i, c in enumerate(self.cache):
                if i not in self.mixers:
                    c.trim(drop)
                    continue
                c.cache = list(self._saved[i])
                inputs, mask = self._capture.values[i]
                self.mixers[i](inputs[:, :keep], None if mask is None else mask[:, :keep], c)
        else:
            for i, (c, saved) in enumerate(zip(self.cache, self._saved)):
                if saved is None:
                    c.trim(fed)
                elif isinstance(c, self._arrays):
                    c.cache = saved
                else:
                    self.cache[i] = saved
            refeed(keep)
        self._release()

    def _release(self) -> None:
        self._saved = []
        self._capture.values.clear()


def dtype_name(dtype: mx.Dtype) -> str:
    return str(dtype).removeprefix("mlx.core.")
