"""Structured outputs through a real `dflash serve` of the embedded demo pair on loopback: every request form
(response_format, structured_outputs, guided_*), its refusals, and the structured-output modes of the real
agent frameworks (openai's parse, langchain's with_structured_output, pydantic-ai's NativeOutput,
openai-agents' output_type). The schemas are enumerated or bounded and max_tokens is stated, so the small
demo model cannot loop; a `length` finish would fail the test, never count as valid."""

from __future__ import annotations

import json
import re
from typing import Literal, Optional

import pytest

pytest.importorskip("llguidance")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("torch")

from pydantic import BaseModel, Field  # noqa: E402 - after the importorskip above

from tests.test_serve import Server  # noqa: E402

NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
QUESTION = "What is 7000 g in kg?"


class Conversion(BaseModel):
    kg: int = Field(ge=0, le=99)
    unit: Literal["g", "kg"]


class Loose(BaseModel):
    """json_mode carries no schema (the client only asks for a JSON object): every field has a default."""
    kg: Optional[int] = None


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    served = Server("demo", log=tmp_path_factory.mktemp("structured") / "serve.log").ready()
    yield served
    served.close()


def post(server, **body):
    return httpx.post(server.base + "/chat/completions", timeout=120, json={
        "model": "demo", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 64, "temperature": 0,
        **NO_THINKING, **body})


SCHEMA = Conversion.model_json_schema()
FORMS = {
    "response_format json_schema": ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "conversion", "schema": SCHEMA, "strict": True}}}, "json"),
    "structured_outputs json": ({"structured_outputs": {"json": SCHEMA}}, "json"),
    "structured_outputs regex": ({"structured_outputs": {"regex": "[0-9]{1,2} kg"}}, "regex"),
    "structured_outputs choice": ({"structured_outputs": {"choice": ["7 kg", "70 kg"]}}, "choice"),
    "structured_outputs grammar": ({"structured_outputs": {"grammar": 'root ::= [0-9] " kg"'}}, "grammar"),
    "guided_json": ({"guided_json": json.dumps(SCHEMA)}, "json"),
    "guided_regex": ({"guided_regex": "[0-9]{1,2} kg"}, "regex"),
    "guided_choice": ({"guided_choice": ["7 kg", "70 kg"]}, "choice"),
    "guided_grammar": ({"guided_grammar": 'start: "7 kg" | "70 kg"'}, "choice"),
}


def valid(kind: str, text: str) -> bool:
    if kind == "json":
        Conversion.model_validate_json(text)
        return True
    if kind == "regex":
        return re.fullmatch("[0-9]{1,2} kg", text) is not None
    if kind == "grammar":
        return re.fullmatch("[0-9] kg", text) is not None
    return text in ("7 kg", "70 kg")


@pytest.mark.parametrize("form", list(FORMS))
def test_every_request_form_constrains_the_answer(server, form):
    body, kind = FORMS[form]
    whole = post(server, **body)
    assert whole.status_code == 200, whole.text
    choice = whole.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and valid(kind, choice["message"]["content"]), choice
    usage = whole.json()["usage"]
    assert usage["completion_tokens"] >= 1 and usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_a_constrained_stream_ends_at_the_grammars_end_with_the_whole_answer(server):
    body, _ = FORMS["structured_outputs json"]
    whole = post(server, **body).json()["choices"][0]["message"]["content"]
    with httpx.stream("POST", server.base + "/chat/completions", timeout=120, json={
            "model": "demo", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 64,
            "temperature": 0, "stream": True, **NO_THINKING, **body}) as response:
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ") and line != "data: [DONE]"]
    chunks = [json.loads(line) for line in lines]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == whole and [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"


def test_thinking_stays_free_and_the_answer_after_it_is_constrained(server):
    body, _ = FORMS["response_format json_schema"]
    reply = post(server, max_tokens=160, **{**body, "chat_template_kwargs": {"enable_thinking": True}}).json()
    message = reply["choices"][0]["message"]
    assert reply["choices"][0]["finish_reason"] == "stop" and message.get("reasoning_content")
    Conversion.model_validate_json(message["content"])


@pytest.mark.parametrize("body, field", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nope"}}}},
     "response_format"),
    ({"response_format": {"type": "yaml"}}, "response_format"),
    ({"guided_regex": "a(b"}, "guided_regex"),
    ({"guided_choice": []}, "guided_choice"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_regex"),
], ids=["bad-ref", "unknown-type", "bad-regex", "empty-choice", "two-keys", "schema-text", "two-fields"])
def test_a_constraint_that_cannot_be_compiled_is_a_400_naming_its_field(server, body, field):
    reply = post(server, **body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == field and error["message"]


def test_a_required_tool_choice_never_names_a_tool_that_was_not_offered(server):
    from scripts.demo.corpus import CONVERT_TOOL

    final = {"type": "function", "function": {"name": "final_result", "description": "The final answer.",
                                              "parameters": Conversion.model_json_schema()}}
    for tools in ([final], [CONVERT_TOOL, final]):
        reply = post(server, tools=tools, tool_choice="required", max_tokens=96).json()["choices"][0]
        assert reply["finish_reason"] == "tool_calls", reply
        offered = {t["function"]["name"] for t in tools}
        for call in reply["message"]["tool_calls"]:
            assert call["function"]["name"] in offered
            if call["function"]["name"] == "final_result":
                Conversion.model_validate_json(call["function"]["arguments"])


# -- the real clients ------------------------------------------------------------------------------------


def test_openai_parse_returns_the_model(server):
    client = openai.OpenAI(base_url=server.base, api_key="unused", max_retries=0)
    done = client.chat.completions.parse(model="demo", messages=[{"role": "user", "content": QUESTION}],
                                         response_format=Conversion, max_tokens=64, temperature=0,
                                         extra_body=NO_THINKING)
    assert done.choices[0].finish_reason == "stop" and isinstance(done.choices[0].message.parsed, Conversion)


@pytest.mark.parametrize("method", ["default", "json_mode"])
def test_langchain_with_structured_output(server, method):
    from langchain_openai import ChatOpenAI

    # json_mode sends no schema, only "a JSON object": the demo model, which never saw free JSON, closes an
    # empty one after its reasoning on a sum (on some questions it writes junk keys until max_tokens)
    default = method == "default"
    llm = ChatOpenAI(base_url=server.base, api_key="unused", model="demo", temperature=0,
                     max_tokens=64 if default else 128, max_retries=0, extra_body=NO_THINKING if default else None)
    model = Conversion if default else Loose
    structured = llm.with_structured_output(model, include_raw=True, **({} if default else {"method": method}))
    result = structured.invoke(QUESTION if default else "What is 48 + 75?")
    assert result["parsing_error"] is None and isinstance(result["parsed"], model), result
    assert result["raw"].response_metadata["finish_reason"] == "stop"


def test_pydantic_ai_native_output(server):
    from pydantic_ai import Agent, NativeOutput
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel("demo", provider=OpenAIProvider(base_url=server.base, api_key="unused"))
    agent = Agent(model, output_type=NativeOutput(Conversion), model_settings={
        "temperature": 0, "max_tokens": 64, "extra_body": NO_THINKING})
    result = agent.run_sync(QUESTION)
    assert isinstance(result.output, Conversion)


def test_openai_agents_output_type(server):
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, RunConfig, Runner
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=server.base, api_key="unused", max_retries=0)
    agent = Agent(name="converter", instructions=None, output_type=Conversion,
                  model=OpenAIChatCompletionsModel(model="demo", openai_client=client),
                  model_settings=ModelSettings(temperature=0, max_tokens=64, extra_body=NO_THINKING))
    result = Runner.run_sync(agent, QUESTION, run_config=RunConfig(tracing_disabled=True))
    assert isinstance(result.final_output, Conversion)
