"""The embedded demo pair (profiles/demo/) and the generator that made it (scripts/make_demo_models.py)."""

from __future__ import annotations

import ast
import json
import random
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


def test_chat_corpus_has_1_to_8_turns_and_checkable_last_answers():
    records = list(corpus.generate_chat(400, seed=2))
    assert records == list(corpus.generate_chat(400, seed=2))
    assert {r["turns"] for r in records} == set(range(1, 9))
    for rec in records:
        msgs = rec["messages"]
        if rec["task"] == "tool_answer":  # the call and the tool's result come between the question and the answer
            assert [m["role"] for m in msgs] == ["user", "assistant"] * (rec["turns"] - 1) + [
                "user", "assistant", "tool", "assistant"]
        else:
            assert [m["role"] for m in msgs] == ["user", "assistant"] * rec["turns"]
        if rec["task"] != "chat":
            assert corpus.is_correct(rec, msgs[-1]["content"]), rec
    # the direct tasks also come in thinking mode after earlier turns (thinking is on in `make chat`)
    assert any(r["task"] in corpus.DIRECT_TASKS and r["thinking"] and r["turns"] > 1 for r in records)


@pytest.mark.parametrize("turns", [(2, 4), (5, 8)])
def test_chat_held_out_last_prompts_are_new(turns):
    held = corpus.heldout_chat(32, seed=5, exclude=set(), turns=turns)
    assert {r["task"] for r in held} == set(corpus.THINK_TASKS + corpus.DIRECT_TASKS)
    assert {r["turns"] for r in held} == set(range(turns[0], turns[1] + 1))
    assert all(r["intended_thinking"] for r in held)
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


@has_target
@has_draft
@pytest.mark.skipif(not (DEMO / "draft2" / "model.safetensors").exists(), reason="demo DFlash 2 draft not built yet")
def test_demo_dflash2_draft_is_lossless_and_accepted_more(engine, heldout):
    """The DFlash 2 draft beside the DFlash 1 one: the target's ids at block 16, and more tokens accepted
    on the same prompts (docs/dflash2.md; engine_speed --drafts measures it on the README's prompts)."""
    from scripts.demo import evaluate

    dflash2 = evaluate.load(TARGET, DEMO / "draft2")
    assert dflash2.draft_info.arch == "dflash2"
    one, two = [], []
    for rec in heldout[::2]:  # one prompt per task
        base = evaluate.run(engine, rec, block_size=16)
        fast = evaluate.run(dflash2, rec, block_size=16)
        assert fast.token_ids == base.token_ids
        one.extend(base.acceptance_lengths)
        two.extend(fast.acceptance_lengths)
    assert sum(two) / len(two) > sum(one) / len(one)


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


# The demo chat template as the committed pair shipped it, before the tools branch: without tools, tool
# calls or tool messages, today's template must render every conversation byte for byte as this one did.
LEGACY_TEMPLATE = (
    "{%- for m in messages -%}{%- if m.role == 'assistant' -%}{%- set content = m.content -%}"
    "{%- if '</think>' in content -%}{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}{%- endif -%}"
    "{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' -}}{%- else -%}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}{%- endif -%}"
)


def test_the_committed_template_is_the_generators():
    from scripts.demo.tokenizer import CHAT_TEMPLATE

    assert (TARGET / "chat_template.jinja").read_text() == CHAT_TEMPLATE


@has_target
def test_without_tools_the_template_renders_as_before(tokenizer):
    records = [*corpus.generate(60, seed=8), *(r for r in corpus.generate_chat(200, seed=8) if not r.get("tools"))]
    records.append({"messages": [{"role": "system", "content": "Be brief."}, *records[0]["messages"]]})
    for rec in records:
        for prompt in (True, False):
            msgs = rec["messages"][:-1] if prompt else rec["messages"]
            for kwargs in ({}, {"enable_thinking": True}, {"enable_thinking": False}):
                now = tokenizer.apply_chat_template(msgs, add_generation_prompt=prompt, tokenize=False, **kwargs)
                before = tokenizer.apply_chat_template(msgs, add_generation_prompt=prompt, tokenize=False,
                                                       chat_template=LEGACY_TEMPLATE, **kwargs)
                assert now == before
                assert now == tokenizer.apply_chat_template(msgs, add_generation_prompt=prompt, tokenize=False,
                                                            tools=[], **kwargs)


@has_target
def test_tools_branch_renders_the_tools_the_calls_and_the_results(tokenizer):
    calls = [{"type": "function", "function": {"name": "convert", "arguments": {"value": "3 km", "unit": "m"}}},
             {"id": "c2", "type": "function", "function": {"name": "convert", "arguments": '{"value": "2 h", "unit": "min"}'}}]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Convert 3 km and 2 hours."},
                {"role": "assistant", "content": "<think>\nTwo calls.\n</think>\n\nBoth:", "tool_calls": calls},
                {"role": "tool", "tool_call_id": "c1", "content": '{"result": 3000, "unit": "m"}'},
                {"role": "tool", "tool_call_id": "c2", "content": {"result": 120, "unit": "min"}},
                {"role": "assistant", "content": None, "tool_calls": calls[:1]}]
    text = tokenizer.apply_chat_template(messages, tools=[corpus.CONVERT_TOOL], add_generation_prompt=True,
                                         enable_thinking=False, tokenize=False)
    assert text == (
        "<|im_start|>system\nBe brief.\n\n# Tools\n<tools>\n"
        '{"name":"convert","description":"Convert units","parameters":{"type":"object","properties":'
        '{"value":{"type":"string"},"unit":{"type":"string"}}}}\n</tools><|im_end|>\n'
        "<|im_start|>user\nConvert 3 km and 2 hours.<|im_end|>\n"
        '<|im_start|>assistant\nBoth:\n<tool_call>\n{"name": "convert", "arguments": {"value": "3 km", "unit": "m"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "convert", "arguments": {"value": "2 h", "unit": "min"}}\n</tool_call><|im_end|>\n'
        '<|im_start|>user\n<tool_response>\n{"result": 3000, "unit": "m"}\n</tool_response>\n'
        '<tool_response>\n{"result": 120, "unit": "min"}\n</tool_response><|im_end|>\n'
        '<|im_start|>assistant\n<tool_call>\n{"name": "convert", "arguments": {"value": "3 km", "unit": "m"}}\n'
        "</tool_call><|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    bare = tokenizer.apply_chat_template(messages[1:2], tools=[corpus.CONVERT_TOOL], add_generation_prompt=True,
                                         tokenize=False)  # no system message: the tools open their own
    assert bare.startswith("<|im_start|>system\n# Tools\n<tools>\n{") and bare.count("<|im_start|>system") == 1


@has_target
def test_tool_records_render_as_the_target_writes_and_reads_them(tokenizer):
    """A call in the history reads exactly as the target wrote it; the byte-level BPE spells <tool_call>
    and the JSON with ordinary pieces (no new tokens, never the mask)."""
    from scripts.demo import train_target

    records = [r for r in corpus.generate_chat(1500, seed=9) if r.get("tools")]
    assert {r["task"] for r in records} >= set(corpus.TOOL_TASKS) and len({r["task"] for r in records}) > 2
    assert {r["thinking"] for r in records if r["task"] in corpus.TOOL_TASKS} == {True, False}
    mask = tokenizer.convert_tokens_to_ids("<|mask|>")
    for rec in records:
        ids, plen = train_target.encode(tokenizer, rec)
        assert mask not in ids and tokenizer.unk_token_id not in ids
        prompt, reply = tokenizer.decode(ids[:plen]), tokenizer.decode(ids[plen:], skip_special_tokens=True)
        assert prompt.startswith("<|im_start|>system\n# Tools\n<tools>\n")
        assert rec["task"] == "chat" or corpus.is_correct(rec, reply), rec  # small talk has no answer to check
        if rec["task"] == "tool_call":
            call = corpus.parse_tool_call(reply)
            assert corpus.final_answer(reply) == corpus.tool_call_text(call["arguments"])
        elif rec["task"] == "tool_answer":
            args = rec["messages"][-3]["tool_calls"][0]["function"]["arguments"]
            result = corpus.run_convert(args)
            assert ("<|im_start|>assistant\n" + corpus.tool_call_text(args) + "<|im_end|>\n<|im_start|>user\n"
                    "<tool_response>\n" + json.dumps(result) + "\n</tool_response><|im_end|>\n") in prompt
            assert str(result["result"]) == rec["answer"]
        else:
            assert "<tool_call>" not in reply
    assert "<tool_call>" not in tokenizer.get_vocab()


def test_the_evaluator_scores_tool_calls_and_answers():
    rec = corpus.tool_conversation("tool_call", False, 1, random.Random(3))
    args = json.loads(rec["answer"])["arguments"]
    right = corpus.tool_call_text(args)
    assert corpus.is_correct(rec, corpus.EMPTY_THINK + right + "\n")
    assert corpus.is_correct(rec, "<think>\nI call convert.\n</think>\n\n" + right)
    wrong_value = corpus.tool_call_text({**args, "value": "999 km"})
    assert not corpus.is_correct(rec, wrong_value)
    assert not corpus.is_correct(rec, right.replace('"convert"', '"convert_units"'))
    assert not corpus.is_correct(rec, right.replace("}}", "}"))  # not JSON
    assert not corpus.is_correct(rec, "Sure: " + right)  # the call must be the whole answer
    assert not corpus.is_correct(rec, "3 km is 3000 m.")
    answer = corpus.tool_conversation("tool_answer", True, 2, random.Random(4))
    assert corpus.is_correct(answer, answer["messages"][-1]["content"])
    assert not corpus.is_correct(answer, f"It is {int(answer['answer']) + 1} m.")
    assert corpus.run_convert({"value": "3 km", "unit": "m"}) == {"result": 3000, "unit": "m"}
    assert corpus.run_convert({"value": "150 min", "unit": "h"}) == {"result": 2.5, "unit": "h"}
    assert "error" in corpus.run_convert({"value": "3 kg", "unit": "m"})
    held = corpus.heldout_tools(8, seed=1, exclude=set())
    assert [r["task"] for r in held[:4]] == ["tool_call", "tool_answer"] * 2
    assert {(r["task"], r["thinking"]) for r in held} == {(t, m) for t in corpus.TOOL_TASKS for m in (True, False)}


@pytest.fixture
def make():
    """scripts/make_demo_models.py as a module; the environment defaults it sets on import are undone."""
    import importlib
    import os

    names = ("HF_HUB_OFFLINE", "TOKENIZERS_PARALLELISM")
    before = {name: os.environ.get(name) for name in names}
    module = importlib.import_module("scripts.make_demo_models")
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
    return module


def test_draft_data_leaves_out_conversations_with_tools(tmp_path, make):
    """train-draft reads system, user and assistant texts only."""
    records = list(corpus.generate_chat(300, seed=1))
    assert any(r.get("tools") for r in records)
    path = make.draft_data(records, tmp_path / "d.jsonl", 1000, seed=0)
    picked = corpus.read_jsonl(path)
    assert len(picked) == sum(not r.get("tools") for r in records)
    assert all(m["role"] in ("user", "assistant") and isinstance(m["content"], str) for r in picked for m in r["messages"])


def test_the_dflash2_stage_starts_from_the_dflash1_draft_and_its_responses(tmp_path, monkeypatch, make):
    """make_demo_models' DFlash 2 stage: train-draft --arch dflash2 --init-draft <DFlash 1 draft>, in its own
    folder seeded with the DFlash 1 stage's responses, skipped on a rerun with the same inputs."""
    import argparse

    from dflash_tui.engines.outputs import CLAIM

    work, target, draft, out = tmp_path / "work", tmp_path / "target", tmp_path / "draft", tmp_path / "draft2"
    for folder, weights in ((target, b"target"), (draft, b"dflash1"), (work / "draft", None)):
        folder.mkdir(parents=True)
        if weights:
            (folder / "model.safetensors").write_bytes(weights)
    (work / "draft" / "responses.jsonl").write_text('{"key": "k", "responses": [[1, 2]]}\n')
    source = tmp_path / "chat.jsonl"
    corpus.write_jsonl(source, corpus.generate_chat(40, seed=3))
    args = argparse.Namespace(seed=0, draft_prompts=10, draft_epochs=2, draft_steps=7, draft2_steps=5, draft_args=[])
    calls = []

    def fake_run(cmd, check, cwd):
        calls.append(cmd)
        build = Path(cmd[cmd.index("--out") + 1])
        assert (build / CLAIM).is_file() and (build / "responses.jsonl").read_text().startswith('{"key": "k"')
        (build / "config.json").write_text("{}")
        (build / "model.safetensors").write_bytes(b"dflash2")

    monkeypatch.setattr(make.subprocess, "run", fake_run)
    make.train_draft2(args, work, target, draft, out, source)
    make.train_draft2(args, work, target, draft, out, source)  # the same inputs: skipped
    assert len(calls) == 1
    cmd = calls[0]
    assert cmd[cmd.index("--arch") + 1] == "dflash2" and cmd[cmd.index("--init-draft") + 1] == str(draft)
    assert cmd[cmd.index("--max-steps") + 1] == "5" and cmd[cmd.index("--out") + 1] == str(work / "draft2")
    assert (out / "model.safetensors").read_bytes() == b"dflash2" and (work / "draft2-done.json").is_file()
    (draft / "model.safetensors").write_bytes(b"dflash1, retrained")
    make.train_draft2(args, work, target, draft, out, source)  # a new DFlash 1 draft trains DFlash 2 again
    assert len(calls) == 2 and "--fresh" in calls[1]
