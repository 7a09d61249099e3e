"""The embedded demo pair (profiles/demo/) and the generator that made it (scripts/make_demo_models.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.demo import corpus

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "profiles" / "demo"
TARGET, DRAFT = DEMO / "target", DEMO / "draft"
has_target = pytest.mark.skipif(not (TARGET / "model.safetensors").exists(), reason="demo target not built yet")
has_draft = pytest.mark.skipif(not (DRAFT / "model.safetensors").exists(), reason="demo draft not built yet")


def test_corpus_is_deterministic_for_a_seed():
    assert list(corpus.generate(300, seed=3)) == list(corpus.generate(300, seed=3))
    assert list(corpus.generate(300, seed=3)) != list(corpus.generate(300, seed=4))


def test_corpus_answers_check_out():
    for rec in corpus.generate(500, seed=0):
        reply = rec["messages"][-1]["content"]
        assert reply.startswith("<think>\n")
        if not rec["thinking"]:
            assert reply.startswith(corpus.EMPTY_THINK)
        if rec["task"] != "chat":
            assert corpus.is_correct(rec, reply), rec


@pytest.fixture(scope="module")
def heldout():
    train = {r["messages"][-2]["content"] for r in corpus.generate(corpus.TRAIN_RECORDS, seed=0)}
    held = corpus.heldout(16, seed=1, train_prompts=train)
    assert not {r["messages"][-2]["content"] for r in held} & train
    return held


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TARGET))


@has_target
def test_tokenizer_never_produces_the_mask_id(tokenizer):
    mask = tokenizer.convert_tokens_to_ids("<|mask|>")
    assert mask != tokenizer.unk_token_id and mask is not None
    for rec in corpus.generate(2000, seed=5):
        for m in rec["messages"]:
            assert mask not in tokenizer.encode(m["content"], add_special_tokens=False)
        ids = tokenizer.apply_chat_template(rec["messages"], tokenize=True, return_dict=False)
        assert mask not in ids


@has_target
def test_chat_template_honours_enable_thinking(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}]
    off = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, enable_thinking=False)
    on = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, enable_thinking=True)
    assert off.startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    assert on.endswith("<|im_start|>assistant\n")
    assert off == on + "<think>\n\n</think>\n\n"


@pytest.fixture(scope="module")
def engine():
    from scripts.demo import evaluate

    return evaluate.load(TARGET, DRAFT if (DRAFT / "model.safetensors").exists() else None)


@has_target
def test_demo_target_answers_held_out_prompts(engine, heldout):
    """Two unseen prompts per task, each in its intended mode (the README's table has all 240)."""
    from scripts.demo import evaluate

    misses = []
    for rec in heldout:
        text = evaluate.run(engine, rec, block_size=1).text
        if not corpus.is_correct(rec, text):
            misses.append((rec["messages"][-2]["content"], corpus.final_answer(text)))
    assert len({r["task"] for r in heldout}) == 8
    assert len(misses) <= 1, misses


@has_target
@has_draft
def test_demo_draft_is_lossless_and_accepted(engine, heldout):
    from scripts.demo import evaluate

    lengths = []
    for rec in heldout[::2]:  # one prompt per task
        base = evaluate.run(engine, rec, block_size=1)
        fast = evaluate.run(engine, rec, block_size=16)
        assert fast.token_ids == base.token_ids
        lengths.extend(fast.acceptance_lengths)
    assert sum(lengths) / len(lengths) >= 5
