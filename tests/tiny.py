"""Random tiny checkpoints in the published layouts, built in seconds (no hub access).

Weights use std 0.2 so top-2 logit margins stay clear of float noise (NOTES.md): greedy ids are then
a sharp oracle. The tokenizer is a small byte-level BPE with Qwen-style special tokens and a chat
template that honours enable_thinking.
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
CHAT_TEMPLATE = (
    "{%- if messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}{%- if m.role != 'system' %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{%- endif %}{%- endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog. 0123456789 + - * / = ( ) , . ! ?",
    "What is 48 + 75? Let me think: 8 + 5 = 13, write 3 carry 1; 4 + 7 + 1 = 12. So 123.",
    "Hello world, speculative decoding with block diffusion drafts is lossless. Ünïcödé ✓ 日本語",
]
VOCAB = 320  # model vocab rows; the tokenizer has fewer entries, as in the public Qwen3 checkpoints


def byte_level_bpe(specials: list[str], corpus: list[str]):
    """A small byte-level BPE (300 entries) trained on `corpus` with `specials` first: every tiny tokenizer's
    backend (Qwen3-style here, harmony and Gemma 4 in their own fixture modules)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus * 20, trainer)
    return tok


def make_tokenizer(out: Path):
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    tok = byte_level_bpe(SPECIALS, CORPUS)
    for token in ("<think>", "</think>"):  # added tokens that stay visible, as in Qwen3
        tok.add_tokens([AddedToken(token, special=False, normalized=False)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>", "<|mask|>"])
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    return fast


def make_target(out: Path, family: str = "qwen3", layers: int = 4, hidden: int = 64, seed: int = 0) -> Path:
    import torch
    import transformers

    out = Path(out)
    tok = make_tokenizer(out)
    common = dict(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, max_position_embeddings=512,
                  initializer_range=0.2, tie_word_embeddings=False, eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
    if family == "qwen3":
        config = transformers.Qwen3Config(**common)
    elif family == "qwen3_moe":
        config = transformers.Qwen3MoeConfig(**common, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=hidden,
                                             decoder_sparse_step=1, norm_topk_prob=True)
    elif family == "llama":
        config = transformers.LlamaConfig(**{k: v for k, v in common.items()})
    elif family in ("qwen3_5", "qwen3_5_moe"):
        return make_qwen3_5(out, tok, family, common, seed)
    elif family == "qwen3_next":
        return make_qwen3_next(out, tok, common, seed)
    elif family == "gpt_oss":
        return make_gpt_oss(out, tok, common, seed)
    elif family in GEMMA4:
        return make_gemma4(out, tok, common, seed, GEMMA4[family])
    elif family == "gemma2":  # embeddings scaled inside the model, not by transformers' embedding module
        config = transformers.Gemma2Config(**{**common, "tie_word_embeddings": True}, sliding_window=GEMMA4_WINDOW)
    elif family == "gemma3_text":  # embeddings scaled by transformers' embedding module, not by mlx-lm's
        config = transformers.Gemma3TextConfig(**{**common, "tie_word_embeddings": True}, sliding_window=GEMMA4_WINDOW)
    else:
        raise ValueError(family)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(str(out))
    write_generation_config(out, tok)
    return out


# Three gated-delta-net layers, then full attention (the tiny hybrids' 4 layers), and the delta net's sizes.
GATED_DELTA = dict(layer_types=["linear_attention"] * 3 + ["full_attention"], linear_conv_kernel_dim=4,
                   linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4)


def make_qwen3_next(out: Path, tok, common: dict, seed: int) -> Path:
    """A Qwen3-Next target (Qwen3-Coder-Next's type): gated DeltaNet layers, then gated attention, every
    layer's MLP a mixture of experts with a shared expert; saved by transformers 5 as published (text only)."""
    import torch
    import transformers

    config = transformers.Qwen3NextConfig(
        **common, **GATED_DELTA, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=common["hidden_size"],
        shared_expert_intermediate_size=common["hidden_size"], decoder_sparse_step=1)
    torch.manual_seed(seed)
    return save_hybrid(transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32), out, tok)


GPT_OSS_WINDOW = 8  # the tiny gpt_oss targets' sliding window: every test prompt and answer crosses it


def make_gpt_oss(out: Path, tok, common: dict, seed: int) -> Path:
    """A gpt-oss target: sliding-window (GPT_OSS_WINDOW) and full attention layers alternating, a learned
    attention sink per head, biased projections, a mixture of experts (clamped SwiGLU), YaRN RoPE as
    published (factor 32 over 4,096 positions); saved by transformers 5 unquantized (bf16/f32 experts)."""
    import torch
    import transformers

    config = transformers.GptOssConfig(
        **{k: v for k, v in common.items() if k != "max_position_embeddings"}, max_position_embeddings=131072,
        sliding_window=GPT_OSS_WINDOW, num_local_experts=4, num_experts_per_tok=2)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # the sinks drawn large enough to matter against logits of this size
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0, 1.0)
    model.save_pretrained(str(out))
    write_generation_config(out, tok)
    return out


GEMMA4_WINDOW = 8  # the tiny gemma4 targets' sliding window: every test prompt and answer crosses it
# The published Gemma 4 text configs' specifics on top of the dense one (gemma-4-31B-it's shape): the 26B-A4B's
# experts beside the dense MLP, and the E2B/E4B-style shared-KV layers with per-layer input embeddings.
GEMMA4 = {
    "gemma4": {},
    "gemma4_moe": dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32),
    "gemma4_shared": dict(num_kv_shared_layers=2, hidden_size_per_layer_input=8, vocab_size_per_layer_input=VOCAB),
}


def make_gemma4(out: Path, tok, common: dict, seed: int, variant: dict) -> Path:
    """A Gemma 4 target in the published multimodal layout (`Gemma4Config` with text, vision and audio configs,
    saved through `AutoModelForImageTextToText`, the language model under `model.language_model`): sliding
    (GEMMA4_WINDOW) and global layers alternating, the global ones with twice the head size, one K/V head and
    keys reused as values (`attention_k_eq_v`), embeddings scaled by sqrt(hidden), final-logit softcapping at 30,
    tied embeddings; `variant` adds experts or shared-KV layers. Random init with std 0.05 (NOTES.md: larger
    values make Gemma 4 repeat one token)."""
    import torch
    import transformers

    head = common["head_dim"]
    text = dict(common, initializer_range=0.05, tie_word_embeddings=True, global_head_dim=2 * head,
                num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=GEMMA4_WINDOW,
                layer_types=["sliding_attention", "full_attention"] * (common["num_hidden_layers"] // 2),
                final_logit_softcapping=30.0, **{"hidden_size_per_layer_input": 0, **variant})
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                  head_dim=16, patch_size=4, position_embedding_size=64)
    audio = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, subsampling_conv_channels=[8, 4],
                 output_proj_dims=32, conv_kernel_size=3)
    config = transformers.Gemma4Config(text_config=text, vision_config=vision, audio_config=audio)
    torch.manual_seed(seed)
    transformers.AutoModelForImageTextToText.from_config(config, dtype=torch.float32).save_pretrained(str(out))
    write_generation_config(out, tok)
    return out


def write_generation_config(out: Path, tok) -> None:
    eos = [tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")]
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos, "do_sample": False}))


def make_qwen3_5(out: Path, tok, family: str, common: dict, seed: int) -> Path:
    """A Qwen3.5 target in the published vision-language layout (text_config + a small vision tower):
    linear-attention (gated delta net) layers interleaved with full attention."""
    import torch
    import transformers

    # three linear-attention layers then full attention, as published (mlx-lm derives this pattern
    # from full_attention_interval and ignores layer_types)
    text = dict(common, num_hidden_layers=4, **GATED_DELTA, rope_parameters={
                    "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                    "mrope_section": [1, 1, 0], "mrope_interleaved": True})
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=common["hidden_size"],
                  patch_size=4, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16)
    if family == "qwen3_5":
        config = transformers.Qwen3_5Config(text_config=text, vision_config=vision)
    else:
        text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=common["hidden_size"],
                    shared_expert_intermediate_size=common["hidden_size"])
        config = transformers.Qwen3_5MoeConfig(text_config=text, vision_config=vision)
    config.tie_word_embeddings = False
    torch.manual_seed(seed)
    return save_hybrid(transformers.AutoModelForImageTextToText.from_config(config, dtype=torch.float32), out, tok)


def save_hybrid(model, out: Path, tok) -> Path:
    """Save a hybrid target, its gated-delta-net weights first drawn like the rest (initializer_range does
    not cover them)."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if "linear_attn" in name and p.dim() > 1:
                p.normal_(0, 0.2)
    model.save_pretrained(str(out))
    write_generation_config(out, tok)
    return out


def write_profile(path: Path, target, draft, max_new_tokens=48, thinking=True, block_size=None, extra="") -> Path:
    """A profile for a tiny pair: the cuda engine in float32, greedy, `max_new_tokens` per answer."""
    lines = [
        'name = "tiny"', 'description = "random tiny pair"',
        "[model]", f'target = "{target}"', f'draft = "{draft}"',
        "[engine]", 'default = "cuda"', 'dtype = "float32"',
    ]
    if block_size:
        lines += ["[dflash]", f"block_size = {block_size}"]
    lines += ["[generation]", "temperature = 0.0", f"max_new_tokens = {max_new_tokens}",
              f"thinking = {'true' if thinking else 'false'}"]
    path.write_text("\n".join(lines) + "\n" + extra)
    return path


def make_draft(out: Path, target: Path, layer_ids: list[int], block_size: int = 16, layers: int = 2,
               seed: int = 1, **overrides) -> Path:
    import torch

    from dflash_tui.engines.checkpoints import draft_config
    from dflash_tui.engines.cuda.draft import DFlashDraft, save_draft

    target_config = json.loads((Path(target) / "config.json").read_text())
    added = json.loads((Path(target) / "tokenizer.json").read_text())["added_tokens"]
    mask_id = next(t["id"] for t in added if t["content"] == "<|mask|>")
    config = draft_config(target_config, layers, layer_ids, block_size, mask_id, **overrides)
    torch.manual_seed(seed)
    model = DFlashDraft(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else 0.2 * torch.randn_like(p))
    save_draft(model, Path(out))
    return Path(out)


FP4 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]  # e2m1's magnitudes; codes 8-15 are their negatives
MXFP4_NOT_CONVERTED = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]


def to_mxfp4(weight):
    """A gpt-oss expert weight [experts, in, out] as published: `_blocks` uint8 [experts, out, in / 32, 16]
    (two e2m1 codes a byte, the even element in the low nibble) and `_scales` uint8 [experts, out, in / 32]
    (a power-of-two exponent + 127 per 32 values), rounded to the nearest representable value."""
    import torch

    rows = weight.transpose(1, 2).contiguous()  # [experts, out, in]: the published layout, rows of outputs
    experts, out, width = rows.shape
    groups = rows.reshape(experts, out, width // 32, 32)
    peak = groups.abs().amax(-1, keepdim=True).clamp_min(2.0 ** -100)
    exponent = torch.ceil(torch.log2(peak / 6.0)).clamp(-127, 127)
    scaled = groups / torch.exp2(exponent)
    magnitudes = torch.tensor(FP4)
    codes = (scaled.abs()[..., None] - magnitudes).abs().argmin(-1)
    codes = torch.where((scaled < 0) & (codes > 0), codes + 8, codes).to(torch.uint8)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks, (exponent[..., 0] + 127).to(torch.uint8)


def make_gpt_oss_mxfp4(out: Path, source: Path) -> Path:
    """A copy of a tiny gpt_oss target with its experts in MXFP4, written by hand in the published layout
    (`*_blocks` / `*_scales` uint8 tensors, biases kept, config.json's quantization_config as released), so
    that transformers' own MXFP4 loading path runs on it."""
    import shutil

    from safetensors.torch import load_file, save_file

    out = Path(out)
    shutil.copytree(source, out)
    tensors = load_file(str(out / "model.safetensors"))
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        blocks, scales = to_mxfp4(tensors.pop(name))
        tensors[f"{name}_blocks"], tensors[f"{name}_scales"] = blocks, scales
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": MXFP4_NOT_CONVERTED}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out
