"""The target model through transformers, with context features captured by hooks.

Only the decoder layers the draft reads are hooked. For the last layer the hook sits on the final
norm, because drafts are trained on transformers' `hidden_states`, whose last entry is post-norm.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import warnings
from typing import Union

import torch

from dflash_tui.engines.checkpoints import TargetInfo
from dflash_tui.engines.cuda.attention import use_for
from dflash_tui.engines.cuda.cache import BUCKET, SlidingBucketLayer, bucket, bucket_cache, bucket_layers
from dflash_tui.engines.cuda.hybrid import ROLLBACK, LinearStateRollback
from dflash_tui.engines.errors import CheckpointError, UserError, describe

FAMILIES = {"qwen3": "Qwen3", "qwen3_moe": "Qwen3-MoE", "llama": "Llama-3.x", "qwen3_5": "Qwen3.5/3.6",
            "qwen3_5_moe": "Qwen3.5/3.6-MoE", "qwen3_5_text": "Qwen3.5/3.6", "qwen3_5_moe_text": "Qwen3.5/3.6-MoE",
            "qwen3_next": "Qwen3-Next", "gpt_oss": "gpt-oss", "gemma4": "Gemma 4"}
# Families whose transformers class refuses "sdpa" at load (gpt-oss: `_supports_sdpa = False`, for its sinks);
# they load as "eager" and are switched to attention.py's function like every other family, which runs their
# sinks exactly (attention.py).
LOAD_EAGER = {"gpt_oss"}
# Families published as a multimodal wrapper (transformers maps the type to its ...ForConditionalGeneration) whose
# language model transformers also has as a text-only class: the engine loads that class from the wrapper's
# text_config, its weights renamed from the wrapper's prefix, so the vision and audio towers are never built and
# their tensors never read (transformers reports them as unexpected and skips them).
TEXT_MODELS = {"gemma4": ("Gemma4ForCausalLM", r"^model\.language_model\.")}


def check_family(info: TargetInfo) -> None:
    if info.model_type not in FAMILIES:
        names = ", ".join(dict.fromkeys(FAMILIES.values()))
        raise UserError(
            f"The target {info.path} is a '{info.model_type}' model, which the CUDA engine does not run; "
            f"supported families: {names}."
        )


def check_loaded(info: TargetInfo, loading: dict) -> None:
    """Refuse a target whose tensors were missing or had the wrong shape (transformers would fill them
    with random values). Its report is read after its own key conversion, so fused MoE experts and the
    Qwen3.5 `language_model` prefix are already accounted for; extra tensors (vision, MTP) are fine."""
    missing = sorted(loading.get("missing_keys") or [])
    if missing:
        raise CheckpointError(f"The target {info.path} has no tensor {missing[0]} ({len(missing)} missing in all); "
                              "the checkpoint is incomplete or not this model, re-download it.")
    mismatched = loading.get("mismatched_keys") or []
    if mismatched:
        name, found, expected = (list(mismatched[0]) + [None, None])[:3]
        raise CheckpointError(f"The target {info.path} has {name} of shape {found} where its config.json implies "
                              f"{expected}; the config and the weights disagree, re-download it.")


def load_model(info: TargetInfo, dtype: torch.dtype, device_map):
    """transformers' causal LM for the checkpoint (the language model alone for a TEXT_MODELS wrapper) and its
    loading report."""
    import transformers

    kwargs = dict(dtype=dtype, attn_implementation="eager" if info.model_type in LOAD_EAGER else "sdpa",
                  device_map=device_map, trust_remote_code=False, use_safetensors=True, output_loading_info=True)
    if info.model_type in TEXT_MODELS:
        from transformers.utils import logging as hf_logging

        name, prefix = TEXT_MODELS[info.model_type]
        config = transformers.AutoConfig.from_pretrained(str(info.path)).get_text_config()
        level = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # its load report lists every tower tensor as unexpected, which is intended
        try:
            return getattr(transformers, name).from_pretrained(str(info.path), config=config,
                                                              key_mapping={prefix: "model."}, **kwargs)
        finally:
            hf_logging.set_verbosity(level)
    return transformers.AutoModelForCausalLM.from_pretrained(str(info.path), **kwargs)


@contextlib.contextmanager
def held_library_output():
    """transformers' log records (its load report) and Python warnings while a target loads, held back: shown
    as they would have been once the load is accepted, dropped when it is refused, so a refusal is its one
    sentence and nothing else."""
    from transformers.utils import logging as hf_logging

    library = hf_logging.get_logger()  # transformers' root logger: its modules log through it
    records: list[logging.LogRecord] = []

    class Hold(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handlers, propagate = library.handlers[:], library.propagate
    library.handlers[:] = [Hold(level=library.level)]
    library.propagate = False
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            yield
    finally:
        library.handlers[:], library.propagate = handlers, propagate
    for record in records:  # (reached only when the load was accepted)
        library.handle(record)
    for warning in caught:
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)


class Target:
    def __init__(self, info: TargetInfo, device: torch.device, dtype: torch.dtype, layer_ids: list[int],
                 device_map=None, rollback: str = ROLLBACK):
        check_family(info)
        with held_library_output():
            try:
                model, loading = load_model(info, dtype, device_map or {"": device})
            except Exception as exc:
                raise CheckpointError(f"The target {info.path} could not be loaded ({describe(exc)}); "
                                      "re-download it.") from None
            check_loaded(info, loading)
        self.model = model.eval()
        self._attach(layer_ids, rollback)

    @classmethod
    def from_model(cls, model, layer_ids: list[int], rollback: str = ROLLBACK) -> "Target":
        """A Target around a model already in memory (benchmarks build random ones of real shapes)."""
        target = cls.__new__(cls)
        target.model = model.eval()
        target._attach(layer_ids, rollback)
        return target

    def _attach(self, layer_ids: list[int], rollback: str) -> None:
        """Embeddings, lm_head, the cache keyword, the attention function (attention.py), a hybrid target's
        rollback (hybrid.py: `rollback` names the way) and the context-feature hooks of the loaded model."""
        use_for(self.model)
        self.embed = self.model.get_input_embeddings()
        self.device = self.embed.weight.device
        self.lm_head = self.model.get_output_embeddings()
        self.layer_ids = list(layer_ids)
        # transformers renamed `past_key_values` to `cache` during 5.x; accept both.
        params = inspect.signature(self.model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        # Gemma 4 with shared-KV layers feeds only the kept rows through them when logits_to_keep is a count
        # (`_maybe_slice_kv_shared_inputs`); an index tensor keeps every row there, for the hooks.
        self._slices_shared = getattr(self.model.config.get_text_config(), "num_kv_shared_layers", 0) > 0
        self._features: dict[int, torch.Tensor] = {}
        self.capture = False
        self.rollback = LinearStateRollback(self.model, rollback)
        decoder = self.model.model
        last = len(decoder.layers) - 1
        for i in self.layer_ids:
            module = decoder.norm if i == last else decoder.layers[i]
            module.register_forward_hook(self._hook(i))

    def _hook(self, layer_id: int):
        def store(module, args, output):
            if self.capture:
                self._features[layer_id] = output[0] if isinstance(output, tuple) else output

        return store

    def new_cache(self, tokens: int = BUCKET):
        """A fresh cache with room for `tokens` positions (rounded up to a bucket) in its attention layers."""
        return self.start_cache(bucket_cache(self.model.config, capacity=bucket(tokens)))

    def start_cache(self, cache):
        if self.rollback:
            self.rollback.start(cache)
        return cache

    def before_verify(self, cache, block_len: int) -> None:
        """Before feeding `block_len` tokens that `commit` may cut back."""
        if self.rollback:
            self.rollback.before_verify(cache, block_len)

    def commit(self, cache, keep: int, block_len: int) -> None:
        """Keep the first `keep` of the `block_len` tokens just fed: every committed token except the newest."""
        if self.rollback:
            self.rollback.commit(cache, keep, block_len)
        elif block_len > keep:
            cache.crop(keep - block_len)

    def forward(self, ids: torch.Tensor, start: int, cache, last_only: bool, capture: bool):
        """Logits for `ids` at positions start.. (only the last position if `last_only`) and, if asked,
        the concatenated context features [1, n, len(layer_ids) * hidden]."""
        positions = torch.arange(start, start + ids.shape[1], device=ids.device).unsqueeze(0)
        self.capture = capture
        keep: Union[int, torch.Tensor] = 1 if last_only else 0
        if last_only and capture and self._slices_shared:
            keep = torch.tensor([ids.shape[1] - 1], device=ids.device)
        out = self.model(
            input_ids=ids, position_ids=positions, use_cache=True, **{self._cache_kwarg: cache}, logits_to_keep=keep,
        )
        self.capture = False
        features = torch.cat([self._features.pop(i).to(self.device) for i in self.layer_ids], dim=-1) if capture else None
        return out.logits, features

    def static_forward(self, ids: torch.Tensor, positions: torch.Tensor, cache, features: bool, reach: int):
        """The graph path's pass: fixed shapes, every input on the device. `ids` [1, n] at `positions` [n]
        are written into the bucket buffers at those positions and attend to every position at or before
        their own, reading the buffers up to `reach` (the step's tier, fixed per captured graph) under a
        mask; positions past the live ones are stale or zero. Returns logits [1, n, vocab] and, if asked,
        the context features as explicit outputs: transformers' hidden_states[i + 1] (post-norm for the
        last layer), no hooks involved."""
        layers = bucket_layers(cache)
        slots = torch.arange(reach, device=ids.device)
        causal = (slots[None, :] <= positions[:, None])[None, None]
        mask: Union[torch.Tensor, dict[str, torch.Tensor]] = causal
        windows = {layer.sliding_window for layer in layers if isinstance(layer, SlidingBucketLayer)}  # (is_sliding)
        if windows:  # sliding layers see (p - window, p]: the mask per layer type, as transformers builds it
            (window,) = windows
            mask = {"full_attention": causal, "sliding_attention": causal & (slots[None, :] > positions[:, None] - window)}
        for layer in layers:
            layer.write_at, layer.read_to = positions, reach
        try:
            out = self.model(
                input_ids=ids, position_ids=positions[None], attention_mask=mask, use_cache=True,
                **{self._cache_kwarg: cache}, output_hidden_states=features,
            )
        finally:
            for layer in layers:
                layer.write_at = None
        if not features:
            return out.logits, None
        return out.logits, torch.cat([out.hidden_states[i + 1].to(self.device) for i in self.layer_ids], dim=-1)
