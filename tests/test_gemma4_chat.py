"""Gemma 4's chat format (issue 29, build 3): the published template (tests/fixtures/gemma-4) rendered with
thinking on and off, the thought channel split from the answer wherever thinking is shown (a resumed chat,
`generate --hide-thinking`, `dflash serve`'s reasoning_content), with thinking off too when the model opens a
channel anyway, and tool calls parsed, streamed and rendered back through the template. A random tiny model
never writes Gemma's markers itself, so the split is driven by known token sequences through the real
tokenizer, detokenizer, splitters and serve shaping; the rendering by the real template."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from dflash_tui.engines.reasoning import GEMMA4, format_of  # noqa: E402 - after the importorskip above
from dflash_tui.serve.tools import (  # noqa: E402 - after the importorskip above
    ToolCallParser,
    parse_text,
    parser_for,
    tool_format,
)
from tests import tiny_gemma4_chat  # noqa: E402 - after the importorskip above
from tests.serve_shaping import accumulated_calls, serve_run, streamed_text  # noqa: E402 - after the importorskip above

THOUGHT = "ones: 8 + 5 = 13, write 3, carry 1."
ANSWER = "So 48 + 75 = 123."
REPLY = f"<|channel>thought\n{THOUGHT}<channel|>{ANSWER}<turn|>"
SHOWN = REPLY[: -len("<turn|>")]  # the text a person reads: the end of the turn is not shown, as an eos is not
QUESTION = [{"role": "user", "content": "What is 48 + 75?"}]
WEATHER = {"city": "Paris, FR", "days": 3, "units": {"temp": "C"}, "flags": [True, None, 1.5]}
CALL = ('<|tool_call>call:get_weather{city:<|"|>Paris, FR<|"|>,days:3,flags:[true,null,1.5],'
        'units:{temp:<|"|>C<|"|>}}<tool_call|>')


@pytest.fixture(scope="module")
def gemma_pair(pairs, tmp_path_factory):
    return tiny_gemma4_chat.make_pair(tmp_path_factory.mktemp("gemma4-chat"), pairs("gemma4")[0])


@pytest.fixture(scope="module")
def gemma(gemma_pair):
    """The tiny Gemma 4 pair on the cuda engine (CPU, float32), loaded once for this file."""
    from dflash_tui.engines import EngineConfig, load_engine

    target, draft = gemma_pair
    return load_engine(EngineConfig(target=str(target), draft=str(draft), engine="cuda", dtype="float32"))


# -- the template and the markers -------------------------------------------------------------------------


def test_the_published_template_renders_thinking_on_and_off(gemma):
    from dflash_tui.engines import GenerationRequest
    from dflash_tui.engines.prompting import chat_ids

    tok = gemma.tokenizer
    assert format_of(tok) is GEMMA4 and tool_format(tok) == "gemma4"
    on = tok.decode(chat_ids(tok, QUESTION, True))
    assert on == "<bos><|turn>system\n<|think|>\n<turn|>\n<|turn>user\nWhat is 48 + 75?<turn|>\n<|turn>model\n"
    off = tok.decode(chat_ids(tok, QUESTION, False))  # an empty channel written into the prompt
    assert off == "<bos><|turn>user\nWhat is 48 + 75?<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"
    assert gemma.prepare(GenerationRequest(messages=QUESTION, thinking=False)) == chat_ids(tok, QUESTION, False)


def test_the_markers_read_as_text_and_the_turn_ends_do_not(gemma, gemma_pair):
    from transformers import AutoTokenizer

    tok = gemma.tokenizer
    ids = tok.encode(REPLY, add_special_tokens=False)
    assert gemma.decode(ids) == SHOWN
    assert gemma.decode(tok.encode(CALL + "<|tool_response>", add_special_tokens=False)) == CALL
    assert gemma.decode(tok.encode("done<eos>", add_special_tokens=False)) == "done"
    published = AutoTokenizer.from_pretrained(str(gemma_pair[0]))  # as transformers loads it
    assert published.encode(REPLY, add_special_tokens=False) == ids  # encoding is unchanged
    assert published.decode(ids, skip_special_tokens=True) == f"thought\n{THOUGHT}{ANSWER}"
    assert gemma.stop_ids() == tok.convert_tokens_to_ids(["<eos>", "<turn|>", "<|tool_response>"])


@pytest.mark.parametrize("family", ["gemma4", "harmony"])
def test_a_reply_stops_at_its_hand_over_tokens_whatever_generation_config_lists(gemma_pair, pairs, tmp_path, family):
    """A tool call hands the turn to the tool: Gemma 4's `<|tool_response>` and `<turn|>`, harmony's `<|call|>`
    and `<|return|>` stop the reply even where generation_config.json names only an eos (engines/reasoning.py,
    stop_ids); a Qwen-style template adds nothing."""
    import json
    import shutil

    from dflash_tui.engines import EngineConfig, load_engine
    from tests import tiny_harmony

    target, draft = gemma_pair if family == "gemma4" else tiny_harmony.make_pair(tmp_path / "harmony")
    edited = tmp_path / "target"
    shutil.copytree(target, edited)
    config = json.loads((edited / "generation_config.json").read_text())
    only_eos = config["eos_token_id"][1:2] if family == "harmony" else config["eos_token_id"][:1]  # endoftext; eos
    (edited / "generation_config.json").write_text(json.dumps({**config, "eos_token_id": only_eos}))
    engine = load_engine(EngineConfig(target=str(edited), draft=str(draft), engine="cuda", dtype="float32"))
    ends = ["<turn|>", "<|tool_response>"] if family == "gemma4" else ["<|return|>", "<|call|>"]
    wanted = list(dict.fromkeys(only_eos + engine.tokenizer.convert_tokens_to_ids(ends)))
    assert engine.stop_ids() == wanted
    qwen = load_engine(EngineConfig(target=str(pairs("qwen3")[0]), draft=str(pairs("qwen3")[1]), engine="cuda",
                                    dtype="float32"))
    assert qwen.stop_ids() == qwen.target_info.stop_ids()


# -- the split -----------------------------------------------------------------------------------------------

CASES = [  # (reply as shown, thinking on, thinking, answer)
    (SHOWN, True, THOUGHT, ANSWER),
    (SHOWN, False, THOUGHT, ANSWER),  # thinking off, and the model opened a channel anyway
    (ANSWER, False, None, ANSWER),  # thinking off: the answer alone
    (f"<|channel>thought\n{THOUGHT}", True, THOUGHT, ""),  # stopped while thinking
    (f"<|channel>thought\n{THOUGHT}<channel|>\n\nLet me check.{CALL}", True, THOUGHT, f"Let me check.{CALL}"),
]


@pytest.mark.parametrize("shown, thinking_on, thinking, answer", CASES)
def test_split_layout_and_streamed_split_agree(gemma, shown, thinking_on, thinking, answer):
    from dflash_tui.core.conversation import split_thinking

    got_thinking, got_answer, _ = split_thinking(shown, thinking_on, GEMMA4)
    assert (got_thinking, got_answer) == (thinking, answer)
    pieces = streamed_text(gemma, shown)
    assert "".join(pieces) == shown
    splitter = GEMMA4.splitter()
    parts = [splitter.add(p) for p in pieces] + [splitter.flush()]
    assert "".join(r for r, _ in parts) == (thinking or "") and "".join(c for _, c in parts) == answer
    chunked = GEMMA4.splitter()  # a server's chunks cut anywhere, markers included
    parts = [chunked.add(shown[i:i + 3]) for i in range(0, len(shown), 3)] + [chunked.flush()]
    assert "".join(r for r, _ in parts) == (thinking or "") and "".join(c for _, c in parts) == answer


def test_a_prompt_that_opened_the_channel_streams_thinking_first(gemma):
    """Thinking on after a tool's response, the template opens the channel in the prompt itself: the prompt's
    decoded end says so, and the reply streams as thinking until the channel closes."""
    from dflash_tui.engines.prompting import chat_ids
    from tests.test_serve import HISTORY, TOOLS

    tok = gemma.tokenizer
    assert GEMMA4.opened_by(gemma.decode(chat_ids(tok, HISTORY, True, None, TOOLS)[-8:]))
    assert not GEMMA4.opened_by(gemma.decode(chat_ids(tok, HISTORY, False, None, TOOLS)[-8:]))
    assert not GEMMA4.opened_by(gemma.decode(chat_ids(tok, QUESTION, True)[-8:]))
    splitter = GEMMA4.splitter(opened=True)
    parts = [splitter.add(t) for t in (THOUGHT, "<channel|>", ANSWER)] + [splitter.flush()]
    assert [p for p in parts if any(p)] == [(THOUGHT, ""), ("", ANSWER)]


@pytest.mark.parametrize("thinking_on", [True, False])
def test_hide_thinking_prints_only_the_answer_and_waits_for_it(gemma, thinking_on):
    from dflash_tui.cli.generate import AnswerFilter

    shown = AnswerFilter(thinking_on, GEMMA4)
    pieces = streamed_text(gemma, SHOWN)
    out = []
    for n, piece in enumerate(pieces):
        got = shown.add([(piece, "target")], final=n == len(pieces) - 1)
        if "<channel|>" not in "".join(pieces[: n + 1]):
            assert got == []  # nothing before the answer starts
        out += [text for text, _ in got]
    assert "".join(out) == ANSWER
    plain = AnswerFilter(thinking_on, GEMMA4)  # no channel at all: the answer as it comes
    assert plain.add([("So", "target")], final=False) == [("So", "target")]


def test_generate_hide_thinking_runs_the_pair_with_thinking_on_and_off(gemma_pair):
    from click.testing import CliRunner

    from dflash_tui.cli import main

    target, draft = gemma_pair
    for flag in ("--thinking", "--no-thinking"):
        result = CliRunner().invoke(main, ["generate", "--engine", "cuda", "--dtype", "float32", "-n", "4", "-t", "0",
                                           "--hide-thinking", flag, "--target", str(target), "--draft", str(draft),
                                           "What is 48 + 75?"])
        assert result.exit_code == 0, result.output


# -- the chat's history and a resumed session ---------------------------------------------------------------


def test_history_sends_the_answer_and_a_resumed_session_renders_the_same(gemma, data_dir):
    from dflash_tui.core import sessions
    from dflash_tui.core.conversation import ChatFlags, ChatSettings, Conversation, resume

    assert GEMMA4.history(SHOWN) == {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHT}
    assert GEMMA4.history(ANSWER) == {"role": "assistant", "content": ANSWER}
    conv = Conversation(gemma, ChatSettings(temperature=0.0, max_new_tokens=4))
    for question in ("What is 48 + 75?", "And 1 + 1?"):
        list(conv.stream(conv.begin(question)))
    conv.turns[0].answer = SHOWN  # a known Gemma reply in the history
    next_ids = conv.begin("Thanks").prompt_ids
    text = gemma.tokenizer.decode(next_ids)
    assert f"<|turn>user\nWhat is 48 + 75?<turn|>\n<|turn>model\n{ANSWER}<turn|>\n<|turn>user\nAnd 1 + 1?" in text
    assert THOUGHT not in text and text.endswith("<|turn>user\nThanks<turn|>\n<|turn>model\n")
    lines = [line for line in conv.writer.path.read_text().splitlines()  # the turns (each prompt record left out)
             if json.loads(line)["type"] != "prompt"]
    conv.close()

    first = json.loads(lines[1])
    first["answer"] = SHOWN
    session_path = conv.writer.path.with_name("resumed.jsonl")
    session_path.write_text("\n".join([lines[0], json.dumps(first), lines[2]]) + "\n")
    again = Conversation(gemma, ChatSettings(temperature=0.0, max_new_tokens=4), record=False)
    resume(again, sessions.read_session(session_path), ChatFlags())
    assert again.begin("Thanks").prompt_ids == next_ids


# -- dflash serve --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shown", [SHOWN, f"<|channel>thought\n{THOUGHT}<channel|>\n{ANSWER}"])
def test_serve_splits_the_thought_channel_into_reasoning_content_streamed_and_whole(gemma, shown):
    texts = streamed_text(gemma, shown)
    whole = serve_run(gemma, texts, False, GEMMA4.splitter())["choices"][0]
    assert whole["message"]["reasoning_content"] == THOUGHT and whole["message"]["content"] == ANSWER
    assert whole["finish_reason"] == "stop"
    deltas = [c["choices"][0]["delta"] for c in serve_run(gemma, texts, True, GEMMA4.splitter()) if c["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == THOUGHT
    assert "".join(d.get("content", "") for d in deltas) == ANSWER
    assert len([d for d in deltas if d.get("reasoning_content")]) > 1  # streamed, not held to the end


# -- tool calls -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cut", [1, 2, 5, 13, 1000])
def test_gemma_calls_parse_whatever_the_chunking(cut):
    text = "Let me check." + CALL + "<|tool_call>call:get_time{}<tool_call|>"
    parser, out, calls = ToolCallParser("gemma4"), [], []
    for i in range(0, len(text), cut):
        got = parser.add(text[i:i + cut])
        out.append(got.text)
        calls += got.calls
    last = parser.flush()
    assert "".join(out) + last.text == "Let me check."
    assert [(c["name"], json.loads(c["arguments"])) for c in calls + last.calls] == [("get_weather", WEATHER),
                                                                                    ("get_time", {})]


@pytest.mark.parametrize("text", [
    '<|tool_call>call:get_weather{city:<|"|>Par<tool_call|>',  # a string that never ends
    "<|tool_call>call:get_weather{city:Paris}<tool_call|>",  # a bare word is not a value
    "<|tool_call>call:get_weather[1]<tool_call|>",  # arguments that are not an object
    "<|tool_call>get_weather{}<tool_call|>",  # no call:
    '<|tool_call>call:get_weather{city:<|"|>Pa',  # cut off by max_tokens
    "<|tool_call>call:f" + "{a:" * 5000 + "1" + "}" * 5000 + "<tool_call|>",  # nested past any real call
], ids=["unended-string", "bare-word", "not-an-object", "no-call", "cut-off", "nested"])
def test_a_malformed_gemma_call_comes_back_as_its_text(text):
    assert parse_text("gemma4", text) == (text, [])


def test_a_gemma_call_streamed_after_its_opening_parses():
    parser = parser_for("gemma4", "<|tool_call>call:get_weather{")
    got, last = parser.add('city:<|"|>Paris<|"|>}<tool_call|>'), parser.flush()
    assert got.text + last.text == "" and [c["name"] for c in got.calls] == ["get_weather"]


def test_serve_streams_a_gemma_call_as_its_id_and_name_then_its_arguments(gemma):
    shown = f"<|channel>thought\nNeed the weather.<channel|>{CALL}"
    texts = streamed_text(gemma, shown)
    chunks = serve_run(gemma, texts, True, GEMMA4.splitter(), parser_for("gemma4"))
    calls = accumulated_calls(chunks)
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [("get_weather", WEATHER)]
    assert calls[0]["ids"][0].startswith("call_") and calls[0]["ids"][1:] == [None]  # id and name, then arguments
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Need the weather."
    assert "".join(d.get("content", "") for d in deltas) == ""
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"
    whole = serve_run(gemma, texts, False, GEMMA4.splitter(), parser_for("gemma4"))["choices"][0]
    assert whole["finish_reason"] == "tool_calls" and whole["message"]["content"] is None
    malformed = serve_run(gemma, streamed_text(gemma, "<|tool_call>call:get_weather{city:Paris}<tool_call|>"), False,
                          GEMMA4.splitter(), parser_for("gemma4"))["choices"][0]
    assert malformed["finish_reason"] == "stop" and not malformed["message"].get("tool_calls")
    assert malformed["message"]["content"] == "<|tool_call>call:get_weather{city:Paris}<tool_call|>"


def test_tools_and_an_openai_tool_history_render_through_the_published_template(gemma):
    """OpenAI sends a call's arguments as JSON text, which the template refuses; they reach it as an object.
    The call, the tool's result and the next turn render as the template writes them."""
    from dflash_tui.cli.generate import tool_calls
    from dflash_tui.engines.prompting import chat_ids
    from tests.test_serve import HISTORY, TOOLS

    tok = gemma.tokenizer
    text = tok.decode(chat_ids(tok, HISTORY, False, None, TOOLS))
    assert ('<|tool>declaration:get_weather{description:<|"|>The weather in a city.<|"|>,parameters:{properties:{'
            'city:{type:<|"|>STRING<|"|>}},required:[<|"|>city<|"|>],type:<|"|>OBJECT<|"|>}}<tool|>') in text
    assert text.endswith('<|turn>model\n<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>'
                         '<|tool_response>response:get_weather{value:<|"|>18 C, sunny<|"|>}<tool_response|>')
    assert HISTORY[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'  # the request is untouched
    # the call the model wrote is what `dflash generate --tools` prints
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in tool_calls(
        f"<|channel>thought\nx<channel|>{CALL}", True, "gemma4", GEMMA4)] == [("get_weather", WEATHER)]
