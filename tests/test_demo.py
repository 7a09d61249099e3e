"""The embedded demo pair (profiles/demo/) and the generator that made it (scripts/make_demo_models.py)."""

from __future__ import annotations

import ast
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


def test_chat_corpus_has_1_to_4_turns_and_checkable_last_answers():
    records = list(corpus.generate_chat(400, seed=2))
    assert records == list(corpus.generate_chat(400, seed=2))
    assert {r["turns"] for r in records} == {1, 2, 3, 4}
    for rec in records:
        msgs = rec["messages"]
        assert [m["role"] for m in msgs] == ["user", "assistant"] * rec["turns"]
        if rec["task"] != "chat":
            assert corpus.is_correct(rec, msgs[-1]["content"]), rec
    # the direct tasks also come in thinking mode after earlier turns (thinking is on in `make chat`)
    assert any(r["task"] in corpus.DIRECT_TASKS and r["thinking"] and r["turns"] > 1 for r in records)


def test_chat_held_out_last_prompts_are_new():
    held = corpus.heldout_chat(24, seed=5, exclude=set())
    assert {r["task"] for r in held} == set(corpus.THINK_TASKS + corpus.DIRECT_TASKS)
    assert all(2 <= r["turns"] <= 4 and r["intended_thinking"] for r in held)
    last = {r["messages"][-2]["content"] for r in held}
    train = list(corpus.generate_chat(2000, seed=6, exclude=last))
    assert not last & {r["messages"][-2]["content"] for r in train}


@has_target
def test_history_is_rendered_without_earlier_think_blocks(tokenizer):
    """Training renders earlier turns as the chat template does at inference: answers only."""
    from scripts.demo import train_target

    rec = corpus.conversation("add", True, 3, __import__("random").Random(1))
    ids, plen = train_target.encode(tokenizer, rec)
    prompt = tokenizer.decode(ids[:plen])
    assert prompt.count("<think>") == 0 and prompt.count("<|im_start|>user") == 3
    for m in rec["messages"][:-1:2]:
        assert m["content"] in prompt
    assert tokenizer.decode(ids[plen:]).startswith("<think>")


@has_target
@pytest.mark.parametrize("torn", [b"", b"PK\x03\x04 cut short"], ids=["empty", "truncated"])
def test_a_token_cache_cut_short_by_a_stopped_run_is_rebuilt(tokenizer, tmp_path, torn):
    """A run killed while saving its token cache must not stop the next run with a traceback."""
    from scripts.demo import train_target

    records = list(corpus.generate(4, 0))
    cache = tmp_path / "tokens.pt"
    cache.write_bytes(torn)
    data = train_target.tokenize_all(tokenizer, records, cache, "k")
    assert data == [train_target.encode(tokenizer, r) for r in records]
    assert train_target.tokenize_all(tokenizer, [], cache, "k") == data  # now a whole cache, read back
    assert not cache.with_suffix(".tmp").exists()


def test_training_batches_cover_each_epoch_once_in_length_sorted_groups_and_resume_alike():
    """The target's batch plan: every record at most once per epoch (all but a partial group), rows of a batch drawn
    from one length-sorted group, and the batch of a step the same whether reached in order or straight
    after a resume, so a resumed run trains on what an uninterrupted one would."""
    import random

    from scripts.demo.train_target import Batches

    rng = random.Random(0)
    data = [([0] * rng.randrange(5, 300), 1) for _ in range(4000)]
    plan = Batches(data, seed=3, batch=16)
    per_epoch = plan.per_epoch
    epoch0 = [plan[k] for k in range(per_epoch)]
    seen = [i for b in epoch0 for i in b]
    assert len(seen) == len(set(seen)) == len(data) - len(data) % (16 * 32)
    spread = sum(max(len(data[i][0]) for i in b) - min(len(data[i][0]) for i in b) for b in epoch0) / per_epoch
    assert spread < 20  # unsorted rows of 5-300 tokens would differ by about 250
    epoch1 = [plan[per_epoch + k] for k in range(per_epoch)]
    assert epoch1 != epoch0 and sorted(map(sorted, epoch1)) != sorted(map(sorted, epoch0))
    resumed = Batches(data, seed=3, batch=16)
    assert [resumed[k] for k in (per_epoch + 7, 5, per_epoch * 2 + 1)] == [epoch1[7], epoch0[5], plan[per_epoch * 2 + 1]]


def test_too_few_records_for_one_batch_is_one_clear_error_not_a_division_by_zero():
    from scripts.demo.train_target import Batches, TooLittleData

    with pytest.raises(TooLittleData, match="10 training sequences do not fill one batch of 16"):
        Batches([([0, 1, 2], 1)] * 10, seed=0, batch=16)
    exactly_one = Batches([([0, 1, 2], 1)] * 16, seed=0, batch=16)
    assert exactly_one.per_epoch == 1 and sorted(exactly_one[0]) == sorted(exactly_one[1]) == list(range(16))


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


def demo_profile():
    """The demo profile as `make chat` opens it (imported here, so the corpus tests need no engine)."""
    from dflash_tui.core.profiles import load_profile

    return load_profile(str(ROOT / "profiles" / "demo.toml"))


CONVERSATION = [  # three questions in a row in one session, as a newcomer asks them in `make chat`
    ("What is 327 + 589?", "add", "916"),
    ("Which is larger, 412 or 398?", "compare", "412"),
    ("How much is 8 times 12?", "mul", "96"),
]
# The session of issue 17, where the target once lost the 7 of the list.
ISSUE_17 = [
    ("Sort these numbers from smallest to largest: 42, 7, 19, 88, 3.", "sort", "3, 7, 19, 42, 88"),
    ("Convert 3 km to meters.", "convert", "3000"),
    ("What is 48 + 75?", "add", "123"),
]
# What a newcomer meets first, each with its right answer: the demo profile's example buttons and the
# prompts of the benchmarks the README quotes.
FIRST_CONTACT = {
    "What is 48 + 75?": ("add", "123"),
    "How many meters are in 3 km?": ("convert", "3000"),
    "Sort these numbers from smallest to largest: 42, 17, 35.": ("sort", "17, 35, 42"),
    "What is 327 + 589?": ("add", "916"),
    "What is 904 - 358?": ("sub", "546"),
    "How much is 8 times 12?": ("mul", "96"),
    "Sort these numbers from smallest to largest: 42, 7, 19, 88, 3.": ("sort", "3, 7, 19, 42, 88"),
    "What is 912 - 347?": ("sub", "565"),
    "How many centimeters are in 3 meters?": ("convert", "300"),
}


def benchmark_prompts(name: str) -> list[str]:
    """The PROMPTS list of benchmarks/<name>.py, read without running the script."""
    tree = ast.parse((ROOT / "benchmarks" / f"{name}.py").read_text())
    found = [node.value for node in tree.body if isinstance(node, ast.Assign)
             and any(isinstance(t, ast.Name) and t.id == "PROMPTS" for t in node.targets)]
    assert found, f"benchmarks/{name}.py has no PROMPTS list"
    return ast.literal_eval(found[0])


def _chat(engine, questions):
    """Ask `questions` in one Conversation with the demo profile's settings; returns it and the answers."""
    from dflash_tui.core.conversation import ChatSettings, Conversation

    profile = demo_profile()
    conv = Conversation(engine, ChatSettings.from_profile(profile), profile=profile, record=False)
    assert conv.settings.thinking and conv.settings.block_size == 16
    answers = []
    for question, _, _ in questions:
        active = conv.begin(question)
        for _ in conv.stream(active):
            pass
        answers.append(conv.turns[-1].answer)
    assert len(active.messages) == 2 * len(questions) - 1  # the last turn saw all the earlier ones
    return conv, answers


@has_target
@has_draft
def test_demo_pair_answers_a_three_turn_conversation(engine):
    """The TUI's own controller, the demo profile's settings (thinking on, temperature 0, block 16):
    each answer is right with the earlier turns in the history, and the draft keeps it lossless."""
    conv, answers = _chat(engine, CONVERSATION)
    for (question, task, answer), text in zip(CONVERSATION, answers):
        assert corpus.is_correct({"task": task, "answer": answer}, text), (question, corpus.final_answer(text))
    # block 1 writes the same last answer over the same history
    conv.set_block(1)
    conv.turns.pop()
    active = conv.begin(CONVERSATION[-1][0])
    for _ in conv.stream(active):
        pass
    assert conv.turns[-1].answer == answers[-1]


@has_target
@has_draft
def test_demo_pair_answers_the_issue_17_session(engine):
    _, answers = _chat(engine, ISSUE_17)
    misses = [(q, corpus.final_answer(text)) for (q, task, answer), text in zip(ISSUE_17, answers)
              if not corpus.is_correct({"task": task, "answer": answer}, text)]
    assert not misses, misses


@has_target
@has_draft
def test_the_examples_and_benchmark_prompts_are_answered_right(engine):
    """Each as the first message of a chat with the demo profile's settings (thinking on, block 16)."""
    prompts = [*demo_profile().examples,
               *benchmark_prompts("engine_speed"), *benchmark_prompts("tui_overhead")]
    assert set(prompts) <= set(FIRST_CONTACT), "give each new example or benchmark prompt its answer here"
    misses = []
    for prompt in dict.fromkeys(prompts):
        task, answer = FIRST_CONTACT[prompt]
        _, (text,) = _chat(engine, [(prompt, task, answer)])
        if not corpus.is_correct({"task": task, "answer": answer}, text):
            misses.append((prompt, corpus.final_answer(text)))
    assert not misses, misses
