"""Tool calls (issue 31, item 1): the formats Qwen3 / Qwen3-Coder and Llama 3.1 write, parsed into OpenAI
`tool_calls` whatever the chunking; a malformed call is text; the streamed chunks are what the openai
client accumulates; and `dflash generate --tools FILE.json` renders the tools and prints the calls."""

from __future__ import annotations

import asyncio
import json

import pytest

from dflash_tui.serve.tools import ToolCallParser, harmony_opening, parse_hermes_block, parse_llama_json, parse_text
from tests.serve_shaping import accumulated_calls, serve_run

WEATHER = {"city": "Paris", "days": 3, "units": {"temp": "C"}}
HERMES = ('Let me look that up.\n<tool_call>\n{"name": "get_weather", "arguments": ' + json.dumps(WEATHER)
          + '}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
CODER = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
         "</parameter>\n<parameter=units>\n{\"temp\": \"C\"}\n</parameter>\n</function>\n</tool_call>")
LLAMA = '<|python_tag|>{"name": "get_weather", "parameters": ' + json.dumps(WEATHER) + '}; {"name": "get_time", "parameters": {}}'


def chunked(parser: ToolCallParser, text: str, cut: int) -> tuple[str, list[dict]]:
    out, calls = [], []
    for i in range(0, len(text), cut):
        got = parser.add(text[i:i + cut])
        out.append(got.text)
        calls += got.calls
    last = parser.flush()
    return "".join(out) + last.text, calls + last.calls


def names_args(calls: list[dict]) -> list[tuple[str, dict]]:
    return [(c["name"], json.loads(c["arguments"])) for c in calls]


@pytest.mark.parametrize("cut", [1, 2, 3, 5, 7, 11, 64, 1000])
def test_hermes_json_and_xml_forms_parse_whatever_the_chunking(cut):
    text, calls = chunked(ToolCallParser("hermes"), HERMES, cut)
    assert text == "Let me look that up.\n\n"
    assert names_args(calls) == [("get_weather", WEATHER), ("get_time", {})]
    assert all(c["id"].startswith("call_") for c in calls) and calls[0]["id"] != calls[1]["id"]
    text, calls = chunked(ToolCallParser("hermes"), CODER, cut)
    assert text == "" and names_args(calls) == [("get_weather", WEATHER)]


@pytest.mark.parametrize("cut", [1, 4, 9, 1000])
def test_llama_json_calls_are_the_whole_answer(cut):
    text, calls = chunked(ToolCallParser("llama3_json"), LLAMA, cut)
    assert text == "" and names_args(calls) == [("get_weather", WEATHER), ("get_time", {})]
    text, calls = chunked(ToolCallParser("llama3_json"), "The weather is fine {not a call}.", cut)
    assert text == "The weather is fine {not a call}." and calls == []


@pytest.mark.parametrize("fmt, text", [
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": </tool_call> and more'),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'),  # cut off by max_tokens
    ("hermes", "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</tool_call>"),
    ("hermes", '<tool_call>["not", "an", "object"]</tool_call>'),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Pa'),
    ("llama3_json", '{"parameters": {}}'),
])
def test_a_malformed_call_comes_back_as_the_text_it_was(fmt, text):
    for cut in (1, 3, len(text)):
        got, calls = chunked(ToolCallParser(fmt), text, cut)
        assert calls == [] and got == text


def test_plain_text_passes_through_and_partial_tags_are_held_back_only_until_they_differ():
    parser = ToolCallParser("hermes")
    assert parser.add("a <tool").text == "a "
    assert parser.add("box> b").text == "<toolbox> b"
    assert parser.flush().text == ""
    assert parse_text("hermes", "no call here") == ("no call here", [])


def test_parsers_read_wrapped_and_nested_forms():
    assert parse_hermes_block('{"name": "f", "arguments": "{\\"a\\": 1}"}')["arguments"] == '{"a": 1}'
    assert parse_llama_json("just text") is None


def test_streamed_tool_calls_are_chunks_the_openai_client_accumulates():
    """The shaper's chunks for a parsed call: the id and name, then the arguments as a delta, then
    finish_reason tool_calls; each is a valid ChatCompletionChunk, and the non-streamed message has them."""
    openai_types = pytest.importorskip("openai.types.chat")
    pytest.importorskip("starlette")
    from dflash_tui.engines.events import StepEvent
    from dflash_tui.serve.api import Params
    from dflash_tui.serve.app import ChatShaper, Piece

    parser = ToolCallParser("hermes")
    texts = [HERMES[i:i + 9] for i in range(0, len(HERMES), 9)]

    def source():
        async def gen():
            for n, text in enumerate(texts):
                last = n == len(texts) - 1
                got = parser.add(text)
                if last:
                    tail = parser.flush()
                    got.text += tail.text
                    got.calls += tail.calls
                event = StepEvent(drafted=[], accepted=0, emitted=[n], pieces=[(text, "target")],
                                  finish_reason="stop" if last else None)
                yield Piece(content=got.text, calls=got.calls, event=event, ids=[n],
                            finish="tool_calls" if last else None)
            yield Piece(summary=None, finish="tool_calls")
        return gen()

    async def stream() -> list[dict]:
        shaper = ChatShaper(Params(model="tiny", include_usage=True), [1, 2, 3], chat=True)
        return [json.loads(raw.decode()[6:]) for raw in [b async for b in shaper.stream(source())][:-1]]

    chunks = asyncio.run(stream())
    calls = accumulated_calls(chunks)
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [("get_weather", WEATHER),
                                                                                    ("get_time", {})]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"
    assert chunks[-1]["usage"]["completion_tokens"] == len(texts)
    parser = ToolCallParser("hermes")
    whole = asyncio.run(ChatShaper(Params(model="tiny"), [1], chat=True).whole(source()))
    message = openai_types.ChatCompletion.model_validate(whole).choices[0].message
    assert message.content == "Let me look that up." and [c.function.name for c in message.tool_calls] == [
        "get_weather", "get_time"]


def test_generate_with_tools_renders_them_and_prints_the_parsed_calls(pairs, tmp_path):
    """`dflash generate --tools FILE.json`: the tools go through the target's template (the prompt grows by
    the tools block), and the calls parsed from the answer are printed (none from a random tiny target)."""
    pytest.importorskip("torch")
    import shutil

    from click.testing import CliRunner

    from dflash_tui.cli import main
    from dflash_tui.engines.prompting import load_tokenizer
    from tests.test_serve import TOOLS, TOOLS_TEMPLATE

    target, draft = pairs("qwen3")
    copy = tmp_path / "target"
    shutil.copytree(target, copy)
    (copy / "chat_template.jinja").write_text(TOOLS_TEMPLATE)
    tools_file = tmp_path / "tools.json"
    tools_file.write_text(json.dumps(TOOLS))
    args = ["generate", "--target", str(copy), "--draft", str(draft), "--engine", "cuda", "--dtype", "float32",
            "-n", "6", "-t", "0", "Weather in Paris?"]
    result = CliRunner().invoke(main, args + ["--tools", str(tools_file), "--json"])
    assert result.exit_code == 0, result.output
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert events[-2] == {"event": "tool_calls", "tool_calls": []}
    tokenizer = load_tokenizer(copy)
    want = tokenizer.apply_chat_template([{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS,
                                         add_generation_prompt=True, tokenize=True, enable_thinking=True,
                                         return_dict=False)
    assert events[-1]["prompt_tokens"] == len(want)
    plain = CliRunner().invoke(main, args + ["--tools", str(tools_file)])
    assert plain.exit_code == 0 and "0 tool calls parsed" in plain.stderr
    refused = CliRunner().invoke(main, ["generate", "--target", str(target), "--draft", str(draft), "--engine",
                                        "cuda", "-n", "2", "--tools", str(tools_file), "hi"])
    assert refused.exit_code != 0 and "no tools branch" in refused.output


def test_the_tool_calls_of_an_answer_are_printed_as_openai_calls():
    from dflash_tui.cli.generate import tool_calls

    calls = tool_calls("<think>\nweather?\n</think>\n\n" + HERMES, True, "hermes")
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", WEATHER), ("get_time", {})]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)


# -- gpt-oss's harmony (issue 29): a message to functions.NAME on the commentary channel -------------------

HARMONY_CALLS = (  # the analysis, then the call as the model writes it (recipient in the channel part), ended by
    # <|call|>, a stop id the text does not show; and the form the template renders history in (recipient in
    # the role part), followed by a final answer
    "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
    "to=functions.get_weather <|constrain|>json<|message|>" + json.dumps(WEATHER),
    "<|channel|>analysis<|message|>Two calls.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary "
    "json<|message|>" + json.dumps(WEATHER) + "<|end|><|start|>assistant to=functions.get_time<|channel|>commentary "
    "json<|message|>{}<|end|><|start|>assistant<|channel|>final<|message|>Done.",
)


@pytest.mark.parametrize("cut", [1, 2, 3, 7, 13, 1000])
def test_harmony_calls_parse_from_the_raw_reply_whatever_the_chunking(cut):
    from dflash_tui.serve.tools import parser_for

    assert parser_for("harmony").raw and not parser_for("hermes").raw
    text, calls = chunked(parser_for("harmony"), HARMONY_CALLS[0], cut)
    assert text == "" and names_args(calls) == [("get_weather", WEATHER)]
    text, calls = chunked(parser_for("harmony"), HARMONY_CALLS[1], cut)
    assert text == "" and names_args(calls) == [("get_weather", WEATHER), ("get_time", {})]
    assert parse_text("harmony", HARMONY_CALLS[1])[1][0]["name"] == "get_weather"


def test_a_harmony_call_is_complete_only_when_its_message_ends():
    from dflash_tui.serve.tools import parser_for

    parser = parser_for("harmony")
    head = "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{}"
    assert parser.add(head).calls == []  # <|call|> (the reply's end) or <|end|> may still follow
    assert names_args(parser.add("<|end|>").calls) == [("get_time", {})]
    assert parser.flush().calls == []  # never twice


@pytest.mark.parametrize("body", ['{"city": "Par', "not json", '["not", "an", "object"]'])
def test_a_malformed_harmony_call_comes_back_as_its_text(body):
    from dflash_tui.serve.tools import parser_for

    reply = f"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{body}"
    text, calls = chunked(parser_for("harmony"), reply, 4)
    assert calls == [] and text == body


def test_a_forced_harmony_call_starts_at_its_own_header():
    from dflash_tui.serve.tools import parser_for

    named = harmony_opening({"type": "function", "function": {"name": "get_weather"}})
    assert named == "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    text, calls = chunked(parser_for("harmony", named), json.dumps(WEATHER), 5)
    assert text == "" and names_args(calls) == [("get_weather", WEATHER)]
    required = harmony_opening("required")
    text, calls = chunked(parser_for("harmony", required), "get_time <|constrain|>json<|message|>{}", 3)
    assert names_args(calls) == [("get_time", {})]
    assert harmony_opening("auto") == ""


def test_streamed_harmony_calls_are_chunks_the_openai_client_accumulates():
    """Through the serve shaping: the harmony split sends the analysis as reasoning and the final answer as
    content, the call parser reads the raw reply; the call streams as its id and name, then its arguments."""
    openai_types = pytest.importorskip("openai.types.chat")
    pytest.importorskip("starlette")
    from dflash_tui.engines.reasoning import HARMONY
    from dflash_tui.serve.tools import parser_for

    texts = [HARMONY_CALLS[0][i:i + 6] for i in range(0, len(HARMONY_CALLS[0]), 6)]

    def run(stream: bool):
        return serve_run(None, texts, stream, HARMONY.splitter(), parser_for("harmony"))

    chunks = run(True)
    calls = accumulated_calls(chunks)
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [("get_weather", WEATHER)]
    assert calls[0]["ids"][0].startswith("call_") and calls[0]["ids"][1:] == [None]  # id and name, then arguments
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Need the weather."
    assert "".join(d.get("content", "") for d in deltas) == ""
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"
    message = openai_types.ChatCompletion.model_validate(run(False)).choices[0].message
    assert message.content is None and message.reasoning_content == "Need the weather."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [
        ("get_weather", WEATHER)]
