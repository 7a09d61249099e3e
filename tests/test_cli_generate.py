"""`dflash generate` end to end: exact greedy ids through --json, and bad input as one sentence, exit 2."""

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from dflash_tui.cli import main
from dflash_tui.engines import CONTRACT_VERSION
from tests.oracles import transformers_greedy


def invoke(*args, input=None):
    return CliRunner().invoke(main, list(args), input=input)


def summary_of(output: str) -> dict:
    lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    assert lines[-1]["event"] == "summary" and all(x["event"] == "step" for x in lines[:-1])
    return lines[-1]


# the hybrids at every block size: their rollback follows transformers' linear-attention cache API, which changes
@pytest.mark.parametrize("family,blocks", [("qwen3", "1,4,16"), ("llama", "1,4,16"), ("qwen3_5", "1,2,4,8,16"),
                                           ("qwen3_next", "1,2,4,8,16")])
def test_json_ids_equal_transformers_greedy(pairs, family, blocks):
    target, draft = pairs(family)
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(str(target)).encode("The quick brown fox", add_special_tokens=False)
    expected = transformers_greedy(target, ids, 30)
    for block in blocks.split(","):
        result = invoke("generate", "--target", str(target), "--draft", str(draft), "--raw", "--temperature", "0",
                        "--device", "cpu", "--dtype", "float32", "--json", "-n", "30", "-b", block, "The quick brown fox")
        assert result.exit_code == 0, result.output
        summary = summary_of(result.stdout)
        # generation stops at an eos id, which the reference (run without stops) may pass
        assert summary["token_ids"] == expected[: len(summary["token_ids"])]
        for key in ("text", "acceptance_lengths", "mean_acceptance_length", "decode_tokens_per_s", "prompt_tokens",
                    "generated_tokens", "peak_memory_bytes", "block_size", "engine", "device", "finish_reason"):
            assert key in summary


def test_stdin_prompt_and_plain_output(pairs):
    target, draft = pairs("qwen3")
    result = invoke("generate", "--target", str(target), "--draft", str(draft), "-n", "8", "-", input="What is 48 + 75?")
    assert result.exit_code == 0
    assert "tokens ·" in result.stderr and "tau" in result.stderr


def one_sentence_exit_2(result, *words):
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in result.stderr
    for word in words:
        assert word in lines[0]


def test_bad_inputs_exit_2_with_one_sentence(pairs, tmp_path):
    target, draft = pairs("qwen3")
    t, d = str(target), str(draft)
    one_sentence_exit_2(invoke("generate", "--target", t, "--draft", t, "hi"), "not a DFlash draft")
    one_sentence_exit_2(invoke("generate", "--target", t, "--draft", d, "-b", "0", "hi"), "Block size 0")
    one_sentence_exit_2(invoke("generate", "--target", t, "--draft", d, "-b", "65", "hi"), "Block size 65")
    one_sentence_exit_2(invoke("generate", "--target", str(tmp_path / "nothing"), "hi"), "nothing")
    one_sentence_exit_2(invoke("generate", "--target", t, "--raw", "word " * 700), "context holds 512")
    one_sentence_exit_2(invoke("generate", "--profile", "no-such-profile", "hi"), "no-such-profile")
    broken = tmp_path / "broken.toml"
    broken.write_text('name = "broken"\n[model]\ntarget = "x/y"\nblock_size = = 3\n')
    one_sentence_exit_2(invoke("generate", "--profile", str(broken), "hi"), "broken.toml", "line 4")
    unknown = tmp_path / "unknown.toml"
    unknown.write_text(f'name = "unknown"\n[model]\ntarget = "{t}"\n[dflash]\nblok_size = 3\n')
    one_sentence_exit_2(invoke("generate", "--profile", str(unknown), "hi"), "blok_size", "line 5")
    result = invoke("generate", "--target", t, "--engine", "tpu", "hi")
    assert result.exit_code == 2 and "tpu" in result.output
    one_sentence_exit_2(invoke("generate", "--target", t, ""), "The prompt is empty")
    one_sentence_exit_2(invoke("generate", "--target", t, "--raw", "", input=""), "The prompt is empty")
    one_sentence_exit_2(invoke("generate", "--target", t, "--raw", "--system", "Be brief.", "hi"), "--system", "--raw")
    tools = tmp_path / "tools.json"
    tools.write_text("[]")
    one_sentence_exit_2(invoke("generate", "--target", t, "--raw", "--tools", str(tools), "hi"), "--tools", "--raw")


def test_real_process_exit_code_and_module_entry(pairs):
    target, draft = pairs("qwen3")
    proc = subprocess.run([sys.executable, "-m", "dflash_tui", "generate", "--target", str(target), "--draft", str(target), "x"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: The draft")


def test_hide_thinking_prints_the_answer_only(pairs, tmp_path):
    """On the demo pair (it thinks first): the hidden run prints exactly what follows </think>."""
    full = invoke("generate", "--profile", "demo", "--engine", "cuda", "What is 48 + 75?")
    hidden = invoke("generate", "--profile", "demo", "--engine", "cuda", "--hide-thinking", "What is 48 + 75?")
    assert full.exit_code == 0 and hidden.exit_code == 0, hidden.output
    assert "</think>" in full.stdout and "</think>" not in hidden.stdout
    assert hidden.stdout.strip() == full.stdout.split("</think>", 1)[1].strip() and "123" in hidden.stdout


def test_chat_takes_a_target_and_draft_like_generate(pairs, data_dir):
    target, draft = pairs("qwen3")
    result = invoke("chat", "--plain", "--target", str(target), "--draft", str(draft), "--max-new-tokens", "4",
                    input="hello\n")
    assert result.exit_code == 0, result.output
    from dflash_tui.core import sessions

    (path,) = sessions.session_paths()
    assert sessions.read_session(path).header["target"] == str(target)


def test_the_limit_that_ended_an_answer_is_named(pairs):
    """finish_reason "length" says which limit: max_new_tokens, or the context window filling up."""
    target, draft = pairs("qwen3")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(target))
    short = invoke("generate", "--target", str(target), "--draft", str(draft), "--raw", "--temperature", "0",
                   "--json", "-n", "5", "hello")
    summary = summary_of(short.stdout)
    assert summary["finish_reason"] == "length" and summary["limit"] == "tokens"
    text = "hello world " * 400
    ids = tok.encode(text, add_special_tokens=False)
    room = 506 - len(ids)  # leave a few positions of the tiny target's 512
    text = tok.decode(ids[: min(len(ids), 506)])
    full = invoke("generate", "--target", str(target), "--draft", str(draft), "--raw", "--temperature", "0",
                  "-n", "100", text)
    assert full.exit_code == 0, full.output
    assert "stopped: context full" in full.stderr and room < 100


# -- a server that is not ours (tests/foreign.py, on loopback): unknown is not zero -------------------


@pytest.fixture(scope="module")
def foreign():
    from tests.foreign import ForeignServer

    with ForeignServer() as server:
        yield server


UNKNOWN_FIELDS = ("mean_acceptance_length", "acceptance_lengths", "histogram", "draft_s", "verify_s",
                  "peak_memory_bytes", "peak_memory_kind", "block_size", "reused_prompt_tokens",
                  "prefilled_prompt_tokens")


def test_json_against_a_foreign_server_says_null_for_what_it_cannot_know(foreign):
    result = invoke("generate", "--url", foreign.base, "--json", "-n", "20", "hi")
    assert result.exit_code == 0, result.output
    summary = summary_of(result.stdout)
    assert {k: summary[k] for k in UNKNOWN_FIELDS} == dict.fromkeys(UNKNOWN_FIELDS)  # null, never 0 or 0.0
    assert summary["generated_tokens"] == 6 and summary["text"] == "Hello from a foreign server."
    assert summary["contract"] == CONTRACT_VERSION and summary["acceptance_rule"] is None


def test_text_against_a_foreign_server_shows_a_dash_for_what_it_cannot_know(foreign):
    result = invoke("generate", "--url", foreign.base, "-n", "20", "hi")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "Hello from a foreign server."
    (line,) = [x for x in result.stderr.splitlines() if "tok/s" in x]
    assert "tau – · peak – · block – · remote engine" in line, line
    assert "0.00" not in line and "0 B" not in line and "block 1 " not in line


def test_every_sampling_option_has_help():
    from click.testing import CliRunner

    from dflash_tui.cli import main

    text = " ".join(CliRunner().invoke(main, ["generate", "--help"]).output.split())
    for option, words in (("--top-p", "Nucleus sampling"), ("--top-k", "K likeliest"), ("--min-p", "top token's")):
        assert option in text and words in text, option
