"""engines.remote: SSE framing, the three thinking forms, the server-kind and URL rules (no server), and
what it reports from a server that is not ours (a small stand-in on loopback, tests/foreign.py)."""

from __future__ import annotations

import json

import pytest

from dflash_tui.engines.errors import UserError
from dflash_tui.engines.events import StepEvent
from dflash_tui.engines.remote.client import error_text, parse_prometheus, split_url
from dflash_tui.engines.remote.engine import server_kind
from dflash_tui.engines.remote.sse import encode_event, iter_sse_data, iter_sse_json
from dflash_tui.engines.remote.thinking import ThinkingJoiner, ThinkingSplitter, prompt_opens_thinking
from dflash_tui.engines.remote.wire import step_from_wire, step_to_wire


def test_sse_framing_joins_data_lines_skips_comments_and_stops_at_done():
    lines = [": keep-alive", "data: {\"a\":", "data: 1}", "", "event: x", "data:{\"b\":2}", "", "data: [DONE]", "",
             "data: {\"c\":3}", ""]
    assert list(iter_sse_data(lines))[:2] == ['{"a":\n1}', '{"b":2}']
    assert list(iter_sse_json(lines)) == [{"a": 1}, {"b": 2}]
    assert list(iter_sse_json(encode_event({"x": "é"}).decode().splitlines())) == [{"x": "é"}]


def test_sse_last_event_without_blank_line_is_kept():
    assert list(iter_sse_data(["data: 1"])) == ["1"]


@pytest.mark.parametrize("delta_key", ["reasoning_content", "reasoning"])
def test_joiner_turns_reasoning_deltas_into_inline_think_text(delta_key):
    j = ThinkingJoiner()
    text = "".join(j.add(d) for d in [{delta_key: "ones "}, {delta_key: "carry 1"}, {"content": "123"}, {"content": "."}])
    assert text == "<think>\nones carry 1\n</think>\n\n123."


def test_joiner_drops_the_newlines_mlx_lm_server_sends_around_reasoning():
    """mlx_lm.server streams the reasoning as the model wrote it (deltas as recorded from it on the demo
    target): the newlines around the block and before the answer are dropped, so the text is the local
    engine's, not one with doubled blank lines; a blank line inside the reasoning stays."""
    deltas = [{"role": "assistant", "reasoning": r} for r in ["\n", "Add", " 48", " and 75.", "\n", "\n", "ones:",
                                                               " 13", "\n"]]
    deltas += [{"role": "assistant", "content": c} for c in ["\n", "\n", "48 + 75", " = 123", "."]]
    j = ThinkingJoiner()
    assert "".join(j.add(d) for d in deltas) == "<think>\nAdd 48 and 75.\n\nones: 13\n</think>\n\n48 + 75 = 123."
    j = ThinkingJoiner()  # a stream that ends inside the block, and an answer with no thinking before it
    assert "".join(j.add({"reasoning": r}) for r in ["\n", "so", "\n"]) == "<think>\nso"
    assert ThinkingJoiner().add({"content": "\nhi"}) == "\nhi"


def test_joiner_leaves_inline_think_text_alone():
    j = ThinkingJoiner()
    assert "".join(j.add({"content": c}) for c in ["<think>", "x</think>", "y"]) == "<think>x</think>y"


def _split(chunks, opened=False):
    s = ThinkingSplitter(opened)
    reasoning, content = [], []
    for c in chunks:
        r, t = s.add(c)
        reasoning.append(r)
        content.append(t)
    r, t = s.flush()
    return "".join(reasoning) + r, "".join(content) + t


@pytest.mark.parametrize("cut", range(1, 30))
def test_splitter_never_leaks_a_tag_whatever_the_chunking(cut):
    raw = "<think>\nones: 8 + 5\n</think>\n\n48 + 75 = 123."
    chunks = [raw[i:i + cut] for i in range(0, len(raw), cut)]
    assert _split(chunks) == ("ones: 8 + 5", "48 + 75 = 123.")


def test_splitter_forms():
    assert _split(["plain answer"]) == ("", "plain answer")
    assert _split(["<thi", "nking is not a tag"]) == ("", "<thinking is not a tag")
    assert _split(["inside\n</think>\n\nanswer"], opened=True) == ("inside", "answer")
    assert _split(["<think>\nstill thinking"]) == ("still thinking", "")
    assert _split(["<think>\n\n</think>\n\nno thoughts"]) == ("", "no thoughts")
    assert prompt_opens_thinking("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_step_wire_round_trip():
    event = StepEvent(drafted=[5, 6, 7], accepted=2, emitted=[5, 6, 9], pieces=[("ab", "draft"), ("c", "target")],
                      rejected=[7], rejected_text="z", draft_s=0.1, verify_s=0.2, finish_reason="stop")
    wire = step_to_wire(event)
    assert wire["origins"] == ["draft", "draft", "target"]
    assert step_from_wire(wire) == event


def test_urls_kinds_errors_and_metrics_parsing():
    assert split_url("http://127.0.0.1:8000/v1/") == ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000")
    assert split_url("http://127.0.0.1:8000") == ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000")
    with pytest.raises(UserError, match="not an http"):
        split_url("127.0.0.1:8000")
    assert server_kind({"id": "m", "owned_by": "vllm"}) == "vllm"
    assert server_kind({"id": "m", "owned_by": "sglang"}) == "sglang"
    assert server_kind({"id": "m", "owned_by": "llamacpp"}) == "llama.cpp"
    assert server_kind({"id": "m", "owned_by": "dflash", "dflash": {}}) == "dflash"
    assert server_kind({"id": "m"}) == "openai-compatible"
    assert error_text(b'{"error": {"message": "bad model"}}') == "bad model"
    assert error_text(b'{"detail": "nope"}') == "nope"
    text = ('# HELP x\nvllm:spec_decode_num_drafts_total{engine="0"} 2\nvllm:spec_decode_num_drafts_total{engine="1"} 3\n'
            "vllm:spec_decode_num_accepted_tokens_total 12\n")
    parsed = parse_prometheus(text)
    assert parsed["vllm:spec_decode_num_drafts_total"] == 5 and parsed["vllm:spec_decode_num_accepted_tokens_total"] == 12


def test_a_foreign_server_leaves_what_it_cannot_know_unknown_not_zero():
    """vLLM, SGLang, llama.cpp and mlx_lm.server report no steps, block size, memory or cache reuse: the
    Summary says None (null in JSON), never a measured-looking 0, and the events are not steps."""
    from dflash_tui.engines import CONTRACT_VERSION, EngineConfig, GenerationRequest, Summary, load_engine
    from tests.foreign import ANSWER, PROMPT_TOKENS, ForeignServer

    with ForeignServer() as server:
        engine = load_engine(EngineConfig(target="served", engine="remote", url=server.base))
        assert engine.kind == "openai-compatible" and engine.reports_steps is False
        request = GenerationRequest(messages=[{"role": "user", "content": "hi"}], max_new_tokens=20, block_size=16)
        events = list(engine.generate(request))
        engine.close()
    s = engine.last_summary
    assert "".join(e.text for e in events) == "".join(ANSWER) == s.text
    assert (s.prompt_tokens, s.generated_tokens, s.finish_reason) == (PROMPT_TOKENS, len(ANSWER), "stop")
    unknown = ("acceptance_lengths", "mean_acceptance_length", "histogram", "draft_s", "verify_s", "peak_memory_bytes",
               "peak_memory_kind", "block_size", "graphs", "reused_prompt_tokens", "prefilled_prompt_tokens")
    assert {name: getattr(s, name) for name in unknown} == dict.fromkeys(unknown)
    assert s.contract == CONTRACT_VERSION == 3
    assert Summary.from_dict(json.loads(json.dumps(s.to_dict()))) == s  # None survives a session file
    assert "tau unknown" in " ".join(engine.last_notes)
    assert "dflash" not in server.requests[-1][1]  # nothing of ours is sent to a foreign server


def test_a_failing_model_listing_is_not_needed_when_the_model_is_named():
    """mlx_lm.server's /v1/models crashes in one common set-up while its chat completions work: with
    --model the engine goes on (and says so); without it, the failure is one sentence."""
    from dflash_tui.engines import EngineConfig, GenerationRequest, UserError, load_engine
    from tests.foreign import ANSWER, MODEL, ForeignServer

    with ForeignServer(models_fail=True) as server:
        with pytest.raises(UserError, match="500"):
            load_engine(EngineConfig(target="served", engine="remote", url=server.base))
        engine = load_engine(EngineConfig(target="served", engine="remote", url=server.base, model=MODEL))
        events = list(engine.generate(GenerationRequest(messages=[{"role": "user", "content": "hi"}],
                                                        max_new_tokens=20)))
        engine.close()
    assert "".join(e.text for e in events) == "".join(ANSWER)
    assert any("/v1/models failed" in w and MODEL in w for w in engine.warnings)
    assert server.requests[-1][1]["model"] == MODEL


def test_prompt_ids_reach_a_text_only_server_as_text():
    """`dflash bench --url` sends prompt ids; mlx_lm.server and other generic servers take a completion
    prompt as text only (404/400 on a list of ids), so the ids go as the text they stand for."""
    from pathlib import Path

    from dflash_tui.engines import EngineConfig, GenerationRequest, load_engine
    from tests.foreign import ForeignServer

    demo = str(Path(__file__).resolve().parents[1] / "profiles" / "demo" / "target")
    with ForeignServer(models_fail=True) as server:  # the model named by the folder its tokenizer is in
        engine = load_engine(EngineConfig(target="served", engine="remote", url=server.base, model=demo))
        ids = engine.prepare(GenerationRequest(messages=[{"role": "user", "content": "What is 48 + 75?"}]))
        list(engine.generate(GenerationRequest(prompt_ids=ids, max_new_tokens=4)))
        engine.close()
    path, body = server.requests[-1]
    assert path == "/v1/completions" and isinstance(body["prompt"], str)
    assert engine.tokenizer(body["prompt"], add_special_tokens=False)["input_ids"] == ids


BARE = """
import sys
class NoFrameworks:  # a bare install: pip install dflash-tui, no extras
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers", "mlx", "mlx_lm", "tokenizers"):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, NoFrameworks())
from dflash_tui.cli import main
sys.exit(main(sys.argv[1:], prog_name="dflash", standalone_mode=False))
"""


def test_a_bare_install_generates_through_a_server_whose_model_is_a_local_folder(tmp_path):
    """No transformers: the target's tokenizer cannot load here, so the remote engine goes on without it
    (ids from the server's tokenize route, text from the stream) instead of failing on the import."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tests.foreign import ANSWER, ForeignServer

    demo = str(Path(__file__).resolve().parents[1] / "profiles" / "demo" / "target")
    with ForeignServer(models_fail=True) as server:
        run = subprocess.run([sys.executable, "-c", BARE, "generate", "--url", server.base, "--model", demo, "Hello"],
                             capture_output=True, text=True, timeout=120, cwd=tmp_path,
                             env={**os.environ, "DFLASH_DATA_DIR": str(tmp_path)})
    assert run.returncode == 0, run.stderr[-2000:]
    assert "".join(ANSWER) in run.stdout and "ModuleNotFoundError" not in run.stderr


MLX_ONLY = """
import sys
from importlib.machinery import PathFinder
class NoTorch(PathFinder):  # an MLX-only install: transformers and mlx, no torch (find_spec finds nothing)
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        return None if name.split(".")[0] == "torch" else super().find_spec(name, path, target)
sys.meta_path[:] = [NoTorch if finder is PathFinder else finder for finder in sys.meta_path]
from dflash_tui.cli import main
code = main(sys.argv[1:], prog_name="dflash", standalone_mode=False)
import os
print("TRANSFORMERS", "transformers" in sys.modules, "TORCH", "torch" in sys.modules,
      "ADVICE OFF", "TRANSFORMERS_NO_ADVISORY_WARNINGS" in os.environ)
sys.exit(code)
"""


def test_an_mlx_only_install_is_not_told_pytorch_was_not_found(tmp_path):
    """The remote engine loads the target's tokenizer with transformers, which advises at import that
    PyTorch was not found: on an MLX-only install that is by design, and the advice stays unsaid (and off
    for that import alone)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tests.foreign import ANSWER, ForeignServer

    demo = str(Path(__file__).resolve().parents[1] / "profiles" / "demo" / "target")
    env = {k: v for k, v in os.environ.items() if k != "TRANSFORMERS_NO_ADVISORY_WARNINGS"}
    with ForeignServer(models_fail=True) as server:
        run = subprocess.run([sys.executable, "-c", MLX_ONLY, "generate", "--url", server.base, "--model", demo, "Hello"],
                             capture_output=True, text=True, timeout=120, cwd=tmp_path,
                             env={**env, "DFLASH_DATA_DIR": str(tmp_path)})
    assert run.returncode == 0, run.stderr[-2000:]
    assert "".join(ANSWER) in run.stdout and run.stdout.splitlines()[-1] == "TRANSFORMERS True TORCH False ADVICE OFF False"
    assert "PyTorch" not in run.stderr


def test_plain_chat_exits_1_after_a_failed_turn(data_dir):
    """A turn the server fails (a 500 here) is reported, and `chat --plain` then exits 1, as generate does;
    with every turn answered it exits 0."""
    from click.testing import CliRunner

    from dflash_tui.cli import main
    from tests.foreign import ForeignServer

    with ForeignServer(answers_fail=True) as server:
        failed = CliRunner().invoke(main, ["chat", "--plain", "--url", server.base], input="hello\n")
    assert failed.exit_code == 1 and "the model crashed" in failed.stderr
    with ForeignServer() as server:
        answered = CliRunner().invoke(main, ["chat", "--plain", "--url", server.base], input="hello\n")
    assert answered.exit_code == 0, answered.output


def test_penalties_and_logit_bias_reach_the_server():
    """The remote engine forwards the request's penalties and logit_bias (string keys, as JSON has them);
    none of them when unset."""
    from dflash_tui.engines import EngineConfig, GenerationRequest, load_engine
    from tests.foreign import ForeignServer

    with ForeignServer() as server:
        engine = load_engine(EngineConfig(target="served", engine="remote", url=server.base))
        ask = dict(messages=[{"role": "user", "content": "hi"}], max_new_tokens=4)
        list(engine.generate(GenerationRequest(**ask, presence_penalty=0.5, repetition_penalty=1.2,
                                               logit_bias={7: -100.0})))
        penalized = server.requests[-1][1]
        list(engine.generate(GenerationRequest(**ask)))
        plain = server.requests[-1][1]
        engine.close()
    assert (penalized["presence_penalty"], penalized["repetition_penalty"]) == (0.5, 1.2)
    assert penalized["logit_bias"] == {"7": -100.0} and "frequency_penalty" not in penalized
    assert not {"presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias"} & set(plain)


@pytest.mark.parametrize("kind", ["vllm", "llama.cpp"])
def test_bench_reads_a_speculating_servers_own_counts(kind):
    """`dflash bench --url` against vLLM or llama.cpp running DFlash: the row shows the server's block size and
    tau from its own counts (vLLM's /metrics counters around each request, llama.cpp's response timings),
    not "block 1" with tau unknown; and thinking off reaches llama.cpp's chat template."""
    from dflash_tui.engines import EngineConfig, load_engine
    from dflash_tui.measure.bench import run_bench
    from tests.foreign import ANSWER, SPEC_BLOCK, ForeignServer, spec_steps

    with ForeignServer(speculates=kind) as server:
        engine = load_engine(EngineConfig(target="served", engine="remote", url=server.base))
        result = run_bench(engine, [{"turns": ["one two", "three"]}], [1], max_new_tokens=64, thinking=False,
                           framework=False, repeats=2)
        engine.close()
    [row] = result.rows
    counted = len(ANSWER) - 1  # the prefill's token is not a step
    assert row.block_size == SPEC_BLOCK
    assert row.steps == 2 * spec_steps(len(ANSWER))
    assert row.tau == pytest.approx(counted / spec_steps(len(ANSWER)))
    if kind == "llama.cpp":
        templates = [body for path, body in server.requests  # (the engine's own probe at load says "hi")
                     if path == "/apply-template" and body["messages"][0]["content"] == "one two"]
        assert templates and all(b["chat_template_kwargs"] == {"enable_thinking": False} for b in templates)
