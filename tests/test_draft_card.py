"""What `dflash train-draft` writes beside the weights for other loaders: the config keys vLLM's, SGLang's
and z-lab's DFlash loaders read (README "Which loaders read a trained draft"), the weight names they map,
and the model card (README.md) with its launch commands and the route not to use. A tiny random target and
a two-step run keep it to seconds."""

import json
import os
import shlex
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from dflash_tui.engines import EngineConfig, GenerationRequest, load_engine
from dflash_tui.engines.checkpoints import DraftInfo
from dflash_tui.engines.cuda.training import TrainConfig, Trainer
from dflash_tui.engines.outputs import CARD, MARKER, draft_card, mask_spelling, publish
from tests import tiny

BLOCK = 4
# Read by all three: vLLM (qwen3_dflash.py), SGLang (models/dflash.py, dflash_utils.py), z-lab's MLX load_draft.
SHAPE_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "head_dim", "rms_norm_eps", "rope_theta", "max_position_embeddings", "vocab_size")
DFLASH_KEYS = ("block_size", "num_target_layers", "layer_types", "hidden_act", "architectures", "model_type")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(target dir, draft dir, trainer): two steps on given responses (nothing to generate first)."""
    root = tmp_path_factory.mktemp("card")
    target = tiny.make_target(root / "target")
    data = root / "data.jsonl"
    data.write_text("".join(json.dumps({"turns": [f"say {c}", f"{c} {c} {c}."]}) + "\n" for c in "abcdefgh"))
    out = root / "draft"
    trainer = Trainer(TrainConfig(target=str(target), data=str(data), out=str(out), block_size=BLOCK, max_len=48,
                                  batch_size=2, max_steps=2, val_prompts=1, val_max_new=8, responses="given"))
    trainer.run()
    return target, out, trainer


def test_config_has_the_keys_the_public_loaders_read(trained):
    _, out, trainer = trained
    cfg = json.loads((out / "config.json").read_text())
    assert [k for k in SHAPE_KEYS + DFLASH_KEYS if k not in cfg] == []
    assert cfg["architectures"] == ["DFlashDraftModel"]  # the registry key of vLLM and SGLang
    assert cfg["model_type"] == "qwen3" and cfg["hidden_act"] == "silu"  # SGLang refuses any other activation
    assert cfg["block_size"] == BLOCK and cfg["num_target_layers"] == 4
    assert cfg["layer_types"] == ["full_attention"] * cfg["num_hidden_layers"]  # non-causal in vLLM and SGLang
    dflash = cfg["dflash_config"]
    ids = dflash["target_layer_ids"]
    assert ids and all(0 <= i < cfg["num_target_layers"] for i in ids)
    assert 0 <= dflash["mask_token_id"] < cfg["vocab_size"]
    # SGLang cross-checks mask_token (default "<|MASK|>") against the tokenizer: the spelling is written.
    assert dflash["mask_token"] == "<|mask|>"
    assert trainer.tokenizer.get_vocab()[dflash["mask_token"]] == dflash["mask_token_id"]


def test_weights_use_the_names_the_loaders_map(trained):
    _, out, _ = trained
    cfg = json.loads((out / "config.json").read_text())
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
    per_layer = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "self_attn.q_norm",
                 "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm",
                 "post_attention_layernorm"]
    expected = {"fc.weight", "hidden_norm.weight", "norm.weight"}
    expected |= {f"layers.{i}.{name}.weight" for i in range(cfg["num_hidden_layers"]) for name in per_layer}
    assert set(shapes) == expected  # no embed_tokens / lm_head: every loader takes the target's
    hidden = cfg["hidden_size"]
    assert shapes["fc.weight"] == [hidden, len(cfg["dflash_config"]["target_layer_ids"]) * hidden]


def test_card_says_what_the_draft_is_and_how_to_serve_it(trained):
    target, out, _ = trained
    card = (out / CARD).read_text()
    made = json.loads((out / MARKER).read_text())
    cfg = json.loads((out / "config.json").read_text())
    assert f"# DFlash draft for `{target}`" in card
    assert f"| Block size | {BLOCK} (`block_size`) |" in card
    assert str(cfg["dflash_config"]["target_layer_ids"]) in card
    assert f"id {cfg['dflash_config']['mask_token_id']}, token `<\\|mask\\|>`" in card  # escaped inside the table
    assert f"| Training | {made['steps']} steps" in card and made["steps"] == 2
    assert f"| Measured tau | {made['tau']:.2f}:" in card
    lines = {line.split()[0]: line for line in card.splitlines() if line.startswith(("vllm ", "python -m sglang"))}
    vllm = shlex.split(lines["vllm"])
    assert vllm[:3] == ["vllm", "serve", str(target)] and vllm[3] == "--speculative-config"
    assert json.loads(vllm[4]) == {"method": "dflash", "model": str(out.resolve()), "num_speculative_tokens": BLOCK - 1}
    sglang = shlex.split(lines["python"])
    flags = dict(zip(sglang[3::2], sglang[4::2]))
    assert flags == {"--model-path": str(target), "--speculative-algorithm": "DFLASH",
                     "--speculative-draft-model-path": str(out.resolve()),
                     "--speculative-num-draft-tokens": str(BLOCK), "--dtype": "float32"}
    assert f"dflash generate --target {target} --draft {out.resolve()} --block-size {BLOCK}" in card
    dont = card.split("## Do not use", 1)[1]
    assert "AutoModel.from_pretrained(DRAFT, trust_remote_code=True)" in dont and "fc.weight" in dont
    assert "SGLang refuses" not in card


def test_our_engine_loads_the_draft_beside_its_card(trained):
    target, out, _ = trained
    assert DraftInfo.read(str(out)).mask_token_id == 3
    eng = load_engine(EngineConfig(target=str(target), draft=str(out), engine="cuda"))
    ids = eng.prepare(GenerationRequest(messages=[{"role": "user", "content": "say a"}]))
    list(eng.generate(GenerationRequest(prompt_ids=ids, max_new_tokens=6, temperature=0, block_size=BLOCK, stop_ids=[])))
    assert len(eng.last_summary.token_ids) == 6


def test_automodel_route_is_not_the_draft(trained):
    """What the card warns about: with no modeling file, AutoModel builds a plain Qwen3 and drops fc/hidden_norm."""
    from transformers import AutoModel

    _, out, _ = trained
    model, info = AutoModel.from_pretrained(str(out), trust_remote_code=True, output_loading_info=True)
    assert type(model).__name__ == "Qwen3Model" and not hasattr(model, "fc")
    assert {"fc.weight", "hidden_norm.weight"} <= set(info["unexpected_keys"])
    assert "embed_tokens.weight" in info["missing_keys"]


def test_card_refuses_to_claim_sglang_when_the_mask_clashes():
    cfg = {"block_size": 16, "num_hidden_layers": 1, "hidden_size": 8, "num_target_layers": 36, "vocab_size": 151936,
           "layer_types": ["full_attention"], "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1]}}
    card = draft_card(cfg, target="Qwen/Qwen3-8B", draft="/d", steps=5, tau=None, target_dtype="bfloat16",
                      sglang_mask_clash=151670)
    assert "SGLang refuses this draft as written" in card and "id 151670" in card
    assert "an embedding row no token uses" in card and "| Measured tau | not measured |" in card
    assert '"num_speculative_tokens": 15' in card and "--speculative-num-draft-tokens 16 --dtype bfloat16" in card


def test_mask_spelling(trained):
    _, _, trainer = trained
    tok = trainer.tokenizer
    assert mask_spelling(tok, 3) == ("<|mask|>", None)
    assert mask_spelling(tok, len(tok) + 5) == (None, None)  # a spare embedding row has no spelling


def test_publish_lands_the_card_before_the_marker(tmp_path, monkeypatch):
    landed = []
    replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (landed.append(Path(dst).name), replace(src, dst)))

    def write(folder: Path) -> None:
        for name in (MARKER, CARD, "config.json", "model.safetensors"):
            (folder / name).write_text(name)
        os.chmod(folder / "model.safetensors", 0o600)  # as safetensors writes it

    publish(tmp_path / "out", write)
    assert landed[-1] == MARKER and set(landed) == {MARKER, CARD, "config.json", "model.safetensors"}
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "out" / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask
    assert [p.name for p in (tmp_path / "out").iterdir() if p.name.startswith(".")] == []
