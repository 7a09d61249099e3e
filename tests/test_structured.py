"""Structured outputs (engines/guided.py) on the embedded demo pair, through both engines and both drafts:
lossless under a constraint (at T = 0 every block size gives the constrained target's own block-1 ids, the
answer matches the constraint), the reasoning left free, the distribution kept at T > 0, and the refusals."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("llguidance")
torch = pytest.importorskip("torch")

from dflash_tui.engines import load_engine  # noqa: E402 - after the importorskip above
from dflash_tui.engines.config import EngineConfig, GenerationRequest  # noqa: E402
from dflash_tui.engines.errors import UserError  # noqa: E402
from dflash_tui.engines.guided import Constraint  # noqa: E402

DEMO = Path(__file__).resolve().parents[1] / "profiles" / "demo"
SCHEMA = {"type": "object", "properties": {"kg": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "unit": {"enum": ["g", "kg"]}},
          "required": ["kg", "unit"], "additionalProperties": False}
CONSTRAINTS = {
    "json": Constraint("json", SCHEMA),
    "regex": Constraint("regex", r"[0-9]{1,3} (kg|g)"),
    "choice": Constraint("choice", ["yes", "no", "seven kilograms"]),
}
QUESTION = [{"role": "user", "content": "What is 7000 g in kg?"}]


def engines_available():
    kinds = ["cuda"]
    try:
        import mlx.core  # noqa: F401

        kinds.append("mlx")
    except ImportError:
        pass
    return kinds


@pytest.fixture(scope="module", params=[(e, d) for e in engines_available() for d in ("draft", "draft2")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def demo(request):
    kind, draft = request.param
    engine = load_engine(EngineConfig(target=str(DEMO / "target"), draft=str(DEMO / draft), engine=kind,
                                      dtype="float32"))
    yield engine
    engine.close()


def run(engine, constraint, block_size, thinking=False, **extra):
    request = GenerationRequest(messages=QUESTION, max_new_tokens=96, block_size=block_size, thinking=thinking,
                                temperature=0.0, constraint=constraint, **extra)
    list(engine.generate(request))
    return engine.last_summary


def answer(text: str) -> str:
    return text.split("</think>")[-1].strip() if "</think>" in text else text


def matches(kind: str, text: str) -> bool:
    if kind == "json":
        value = json.loads(text)
        return set(value) == {"kg", "unit"} and 0 <= value["kg"] <= 99 and value["unit"] in ("g", "kg")
    if kind == "regex":
        return re.fullmatch(r"[0-9]{1,3} (kg|g)", text) is not None
    return text in CONSTRAINTS["choice"].value


@pytest.mark.parametrize("kind", list(CONSTRAINTS))
@pytest.mark.parametrize("thinking", [False, True], ids=["direct", "thinking"])
def test_a_constrained_answer_is_the_constrained_targets_own_at_every_block_size(demo, kind, thinking):
    """Blocks 1, 4 and 16 give identical ids; the answer (after the reasoning, when thinking) matches the
    constraint and ends at the grammar's end with finish_reason stop; the reasoning stays the model's own
    words (it is not forced into the grammar)."""
    runs = {b: run(demo, CONSTRAINTS[kind], b, thinking) for b in (1, 4, 16)}
    assert runs[1].token_ids == runs[4].token_ids == runs[16].token_ids
    text = runs[1].text
    assert runs[1].finish_reason == "stop" and matches(kind, answer(text)), text
    if thinking:
        assert text.lstrip().startswith("<think>") and "</think>" in text
        free = run(demo, None, 1, thinking=True).text
        assert free.split("</think>")[0] == text.split("</think>")[0]  # the same reasoning, constrained or not


@pytest.mark.parametrize("kind", engines_available())
def test_the_draft_is_steered_by_the_grammar(kind):
    """A drafted token the grammar forbids can never be accepted, so DFlash 1 takes its argmax among what the
    grammar allows after the picks before it: under a choice whose every token is forced, the whole answer
    is drafted and accepted in the first step."""
    engine = load_engine(EngineConfig(target=str(DEMO / "target"), draft=str(DEMO / "draft"), engine=kind,
                                      dtype="float32"))
    summary = run(engine, Constraint("choice", ["seven kilograms"]), 16)
    engine.close()
    assert answer(summary.text) == "seven kilograms"
    assert summary.acceptance_lengths[0] >= summary.generated_tokens - 1  # all but the prefill's token, at once


def test_sampling_under_a_constraint_keeps_the_constrained_targets_distribution():
    """At T = 1 with the DFlash 2 draft (exact rejection sampling, its q steered by the grammar), the token
    after a forced "=" (the first verified position, where the draft proposed) follows the constrained
    target's softmax there, computed from the target's own logits through transformers: over 600 seeds each
    digit's frequency is within 4.5 standard errors (Bonferroni over the ten digits)."""
    from transformers import AutoModelForCausalLM

    from dflash_tui.engines.guided import Grammars

    engine = load_engine(EngineConfig(target=str(DEMO / "target"), draft=str(DEMO / "draft2"), engine="cuda",
                                      dtype="float32"))
    constraint = Constraint("regex", "=[0-9]")
    ids = engine.prepare(GenerationRequest(messages=QUESTION, thinking=False))
    equals = engine.tokenizer.convert_tokens_to_ids("=")
    guide = Grammars(engine.tokenizer, engine.target_info.vocab_size).guide(constraint, engine.stop_ids(), None)
    guide.settle(0, equals)
    allowed = torch.from_numpy(guide.row())
    model = AutoModelForCausalLM.from_pretrained(str(DEMO / "target"), dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([ids + [equals]])).logits[0, -1]
    p = torch.softmax(logits.masked_fill(~allowed, float("-inf")), -1)
    n, counts = 600, torch.zeros_like(p)
    for seed in range(n):
        request = GenerationRequest(messages=QUESTION, max_new_tokens=4, block_size=8, thinking=False,
                                    temperature=1.0, seed=seed, constraint=constraint)
        steps = [e.emitted for e in engine.generate(request)]
        assert steps[0] == [equals] and engine.last_summary.acceptance_rule == "rejection"
        counts[steps[1][0]] += 1
    engine.close()
    assert counts[~allowed].sum() == 0
    se = (p * (1 - p) / n).sqrt().clamp(min=1e-6)
    assert ((counts / n - p).abs() <= 4.5 * se + 1e-6).all(), (counts, p)
    assert (p > 0.02).sum() >= 2  # the test has something to measure: more than one likely digit


def test_a_constraint_the_library_cannot_compile_is_one_sentence_naming_it(demo):
    for constraint, field in ((Constraint("regex", "a(b", "--regex"), "--regex"),
                              (Constraint("json", {"$ref": "#/nope"}, "response_format"), "response_format")):
        with pytest.raises(UserError) as refused:
            run(demo, constraint, 4)
        message = str(refused.value)
        assert message.startswith(f"{field} cannot be compiled") and "\n" not in message
    with pytest.raises(UserError, match="non-empty list"):
        Constraint("choice", [])
