"""The demo target's tool task, end to end through `dflash serve` and the official `openai` client, and through
the engine alone (`dflash generate --tools`): the model is offered the `convert` function, calls it (by its own
choice and when the call is forced by name), and answers in words once the tool's result comes back. The demo
pair is the real one shipped in the package (profiles/demo); the tool itself is the demo corpus's own
`run_convert`, so the test checks the arithmetic the model reports against the tool's answer, not a string
written here."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("torch")
openai = pytest.importorskip("openai")

from scripts.demo.corpus import CONVERT_TOOL, run_convert  # noqa: E402 - after the importorskip above
from tests.test_serve import Server  # noqa: E402 - after the importorskip above

# Questions in the corpus's own wording ("Convert {x} {s} to {d}.", "How many {d} are in {x} {s}?"): the
# test asks for the behaviour the retrain taught; how well it generalizes is make demo-models' held-out
# evaluation (scripts/demo/evaluate.py, the tool task's table).
QUESTIONS = [("Convert 3 km to m.", {"value": "3 km", "unit": "m"}),
             ("How many g are in 7 kg?", {"value": "7 kg", "unit": "g"})]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    log = tmp_path_factory.mktemp("demo-serve") / "serve.log"
    server = Server("demo", log=log).ready()
    try:
        yield openai.OpenAI(base_url=server.base, api_key="unused", max_retries=0)
    finally:
        server.close()


def ask(client, messages, **kwargs):
    return client.chat.completions.create(model="demo", messages=messages, tools=[CONVERT_TOOL], temperature=0,
                                          max_tokens=96, extra_body=NO_THINKING, **kwargs)


@pytest.mark.parametrize("choice", ["auto", {"type": "function", "function": {"name": "convert"}}],
                         ids=["auto", "named"])
@pytest.mark.parametrize("question,arguments", QUESTIONS, ids=["km-m", "kg-g"])
def test_the_demo_calls_convert_and_answers_from_its_result(client, choice, question, arguments):
    messages = [{"role": "user", "content": question}]
    first = ask(client, messages, tool_choice=choice).choices[0]
    assert first.finish_reason == "tool_calls", first.message.content
    (call,) = first.message.tool_calls
    assert call.function.name == "convert"
    assert json.loads(call.function.arguments) == arguments

    result = run_convert(json.loads(call.function.arguments))
    messages += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)}]
    second = ask(client, messages).choices[0]
    assert second.finish_reason == "stop"
    assert not second.message.tool_calls
    assert f"{result['result']}" in second.message.content


def test_a_streamed_call_accumulates_to_the_same_arguments(client):
    question, arguments = QUESTIONS[0]
    stream = ask(client, [{"role": "user", "content": question}], tool_choice="required", stream=True)
    names, parts, finish = [], [], None
    for chunk in stream:
        choice = chunk.choices[0]
        for delta in choice.delta.tool_calls or []:
            if delta.function.name:
                names.append(delta.function.name)
            parts.append(delta.function.arguments or "")
        finish = choice.finish_reason or finish
    assert (names, finish) == (["convert"], "tool_calls")
    assert json.loads("".join(parts)) == arguments


def test_the_openai_clients_own_tool_helper_gets_a_parsed_call(client):
    """`pydantic_function_tool` and `chat.completions.parse` with the function named (what langchain's
    bind_tools(tool_choice=...) sends): the schema is the client's (titles, required, strict), not the one
    the demo was taught, and the call still parses into the client's own type."""
    from pydantic import BaseModel

    class Convert(BaseModel):
        value: str
        unit: str

    tool = openai.pydantic_function_tool(Convert, name="convert", description="Convert units")
    question, arguments = QUESTIONS[0]
    answer = client.chat.completions.parse(model="demo", messages=[{"role": "user", "content": question}],
                                           tools=[tool], tool_choice={"type": "function", "function": {"name": "convert"}},
                                           temperature=0, max_tokens=96, extra_body=NO_THINKING)
    calls = answer.choices[0].message.tool_calls
    assert calls, answer.choices[0].message.content
    (call,) = calls
    assert call.function.parsed_arguments == Convert(**arguments)


def test_generate_with_tools_prints_the_demos_call_without_a_server(tmp_path):
    """The engine path without a server (`dflash generate --profile demo --tools FILE.json`): the same call,
    parsed from the answer and printed as an OpenAI tool call."""
    from click.testing import CliRunner

    from dflash_tui.cli import main

    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([CONVERT_TOOL]))
    question, arguments = QUESTIONS[1]
    result = CliRunner().invoke(main, ["generate", "--profile", "demo", "--no-thinking", "-t", "0", "-n", "96",
                                       "--tools", str(tools), "--json", question])
    assert result.exit_code == 0, result.output
    events = [json.loads(line) for line in result.stdout.splitlines()]
    (calls,) = [e["tool_calls"] for e in events if e.get("event") == "tool_calls"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [("convert", arguments)]
