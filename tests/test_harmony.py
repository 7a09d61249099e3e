"""gpt-oss's harmony chat format (issue 29): the published template rendered with each reasoning effort,
the analysis channel split from the final answer wherever thinking is shown (the chat and its resumed
sessions, `generate --hide-thinking`, `dflash serve`'s reasoning_content), and the effort everywhere thinking
lives. A random tiny model never writes harmony's markers itself, so the split is driven by known token
sequences through the real tokenizer, detokenizer and splitters; the rendering by the real template."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from dflash_tui.engines.config import EFFORTS  # noqa: E402 - after the importorskip above
from dflash_tui.engines.reasoning import HARMONY, THINK, format_of  # noqa: E402 - after the importorskip above
from tests import tiny_harmony  # noqa: E402 - after the importorskip above
from tests.serve_shaping import serve_run, streamed_text  # noqa: E402 - after the importorskip above

ANALYSIS = "ones: 8 + 5 = 13, write 3, carry 1."
FINAL = "So 48 + 75 = 123."
REPLY = f"<|channel|>analysis<|message|>{ANALYSIS}<|end|><|start|>assistant<|channel|>final<|message|>{FINAL}<|return|>"
SHOWN = REPLY[: -len("<|return|>")]  # the text a person reads: the stop id is not shown, as an eos is not
QUESTION = [{"role": "user", "content": "What is 48 + 75?"}]


@pytest.fixture(scope="module")
def harmony_pair(tmp_path_factory):
    return tiny_harmony.make_pair(tmp_path_factory.mktemp("harmony"))


@pytest.fixture(scope="module")
def harmony(harmony_pair):
    """The tiny harmony pair on the cuda engine (CPU, float32), loaded once for this file."""
    from dflash_tui.engines import EngineConfig, load_engine

    target, draft = harmony_pair
    return load_engine(EngineConfig(target=str(target), draft=str(draft), engine="cuda", dtype="float32"))


# -- the template ---------------------------------------------------------------------------------------


def test_the_published_template_renders_each_effort(harmony):
    from dflash_tui.engines.prompting import chat_ids

    tok = harmony.tokenizer
    assert format_of(tok) is HARMONY
    for effort in EFFORTS:
        text = tok.decode(chat_ids(tok, QUESTION, True, effort))
        assert f"\nReasoning: {effort}\n" in text
        assert text.startswith("<|start|>system<|message|>") and text.endswith(
            "<|start|>user<|message|>What is 48 + 75?<|end|><|start|>assistant")
    assert "\nReasoning: medium\n" in tok.decode(chat_ids(tok, QUESTION, True, None))  # the template's default
    # the request field reaches the same render (what the engines prepare)
    from dflash_tui.engines import GenerationRequest

    request = GenerationRequest(messages=QUESTION, reasoning_effort="high")
    assert "\nReasoning: high\n" in harmony.decode(harmony.prepare(request))


def test_history_sends_the_final_answer_and_the_template_drops_earlier_analysis(harmony):
    from dflash_tui.engines.errors import UserError
    from dflash_tui.engines.prompting import chat_ids

    tok = harmony.tokenizer
    message = HARMONY.history(SHOWN)
    assert message == {"role": "assistant", "content": FINAL, "thinking": ANALYSIS}
    text = tok.decode(chat_ids(tok, QUESTION + [message, {"role": "user", "content": "And 1 + 1?"}], True, "low"))
    assert f"<|start|>assistant<|channel|>final<|message|>{FINAL}<|end|><|start|>user<|message|>And 1 + 1?" in text
    assert ANALYSIS not in text
    with pytest.raises(UserError, match="chat_template.jinja"):  # the raw reply is what the template refuses
        chat_ids(tok, QUESTION + [{"role": "assistant", "content": SHOWN}, {"role": "user", "content": "x"}], True)


def test_the_markers_read_as_text_and_the_turn_ends_do_not(harmony, harmony_pair):
    from transformers import AutoTokenizer

    tok = harmony.tokenizer
    ids = tok.encode(REPLY, add_special_tokens=False)
    assert harmony.decode(ids) == SHOWN
    assert harmony.decode(tok.encode("a call<|call|>", add_special_tokens=False)) == "a call"
    published = AutoTokenizer.from_pretrained(str(harmony_pair[0]))  # as transformers loads it
    assert published.encode(REPLY, add_special_tokens=False) == ids  # encoding is unchanged
    assert published.decode(ids, skip_special_tokens=True) == f"analysis{ANALYSIS}assistantfinal{FINAL}"
    assert harmony.stop_ids() == tok.convert_tokens_to_ids(["<|return|>", "<|endoftext|>", "<|call|>"])


def test_effort_is_refused_where_the_template_does_not_read_it(pair):
    from dflash_tui.engines.errors import UserError
    from dflash_tui.engines.prompting import chat_ids, load_tokenizer

    qwen = load_tokenizer(pair[0])
    assert format_of(qwen) is THINK
    chat_ids(qwen, QUESTION, True, None)
    with pytest.raises(UserError, match="reasoning_effort high does nothing for this model"):
        chat_ids(qwen, QUESTION, True, "high")


# -- the split -------------------------------------------------------------------------------------------

CASES = [  # (reply as shown, thinking, answer)
    (SHOWN, ANALYSIS, FINAL),
    (f"<|channel|>analysis<|message|>{ANALYSIS}", ANALYSIS, ""),  # stopped while thinking
    (f"<|channel|>final<|message|>{FINAL}", None, FINAL),  # no analysis
    ("<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
     '<|constrain|>json<|message|>{"city": "Paris"}', "x", ""),  # a tool call: neither thinking nor answer
    ("plain words, no harmony at all", None, "plain words, no harmony at all"),
]


@pytest.mark.parametrize("shown, thinking, answer", CASES)
def test_split_layout_and_streamed_split_agree(harmony, shown, thinking, answer):
    from dflash_tui.core.conversation import split_thinking

    got_thinking, got_answer, _ = split_thinking(shown, True, HARMONY)
    assert (got_thinking, got_answer) == (thinking, answer)
    pieces = streamed_text(harmony, shown)
    assert "".join(pieces) == shown
    splitter = HARMONY.splitter()
    parts = [splitter.add(p) for p in pieces] + [splitter.flush()]
    assert "".join(r for r, _ in parts) == (thinking or "") and "".join(c for _, c in parts) == answer


def test_hide_thinking_prints_only_the_final_answer_and_waits_for_it(harmony):
    from dflash_tui.cli.generate import AnswerFilter

    shown = AnswerFilter(True, HARMONY)
    pieces = streamed_text(harmony, SHOWN)
    out = []
    for n, piece in enumerate(pieces):
        got = shown.add([(piece, "target")], final=n == len(pieces) - 1)
        if "".join(pieces[: n + 1]).find("final<|message|>") < 0:
            assert got == []  # nothing before the answer starts
        out += [text for text, _ in got]
    assert "".join(out) == FINAL


def test_generate_takes_the_effort_and_refuses_it_for_a_family_without_one(harmony_pair, pair):
    from click.testing import CliRunner

    from dflash_tui.cli import main

    target, draft = harmony_pair
    args = ["generate", "--engine", "cuda", "--dtype", "float32", "-n", "4", "-t", "0", "--hide-thinking"]
    ok = CliRunner().invoke(main, args + ["--target", str(target), "--draft", str(draft), "--reasoning-effort",
                                          "high", "What is 48 + 75?"])
    assert ok.exit_code == 0, ok.output
    refused = CliRunner().invoke(main, args + ["--target", str(pair[0]), "--draft", str(pair[1]),
                                               "--reasoning-effort", "high", "hi"])
    assert refused.exit_code != 0 and "reasoning_effort high does nothing for this model" in refused.output
    bad = CliRunner().invoke(main, args + ["--target", str(target), "--reasoning-effort", "max", "hi"])
    assert bad.exit_code != 0 and "'max' is not one of 'low', 'medium', 'high'" in bad.output


# -- the chat: effort levels, sessions -------------------------------------------------------------------


def test_the_chat_cycles_the_effort_and_a_resumed_session_renders_the_same_history(harmony, data_dir):
    from dflash_tui.core import sessions
    from dflash_tui.core.conversation import ChatFlags, ChatSettings, Conversation, resume

    conv = Conversation(harmony, ChatSettings(temperature=0.0, max_new_tokens=6))
    assert conv.efforts == EFFORTS and conv.effort == "medium"  # the template's default until one is chosen
    assert conv.toggle_thinking() is None and conv.effort == "high"  # the thinking key: the next level
    conv.toggle_thinking()
    assert conv.effort == "low" and conv.settings.thinking  # harmony has no off
    for question in ("What is 48 + 75?", "And 1 + 1?"):
        active = conv.begin(question)
        assert "\nReasoning: low\n" in harmony.decode(active.prompt_ids)
        list(conv.stream(active))
    # a known harmony reply in the history: resent as its final answer, its analysis dropped by the template
    conv.turns[0].answer = SHOWN
    next_ids = conv.begin("Thanks").prompt_ids
    text = harmony.decode(next_ids)
    assert f"<|channel|>final<|message|>{FINAL}<|end|>" in text and ANALYSIS not in text
    lines = [line for line in conv.writer.path.read_text().splitlines()  # the turns (each prompt record left out)
             if json.loads(line)["type"] != "prompt"]
    assert json.loads(lines[1])["settings"]["reasoning_effort"] == "low"
    conv.close()

    # resumed: the recorded effort, and the same history (the file's first answer made the known reply)
    first = json.loads(lines[1])
    first["answer"] = SHOWN
    older = [lines[0], json.dumps(first), lines[2]]
    session_path = conv.writer.path.with_name("resumed.jsonl")
    session_path.write_text("\n".join(older) + "\n")
    again = Conversation(harmony, ChatSettings(temperature=0.0, max_new_tokens=6), record=False)
    resume(again, sessions.read_session(session_path), ChatFlags())
    assert again.effort == "low" and again.begin("Thanks").prompt_ids == next_ids
    # a session written before reasoning_effort existed loads, with the chat's own effort
    for i in (1, 2):
        record = json.loads(older[i])
        del record["settings"]["reasoning_effort"]
        older[i] = json.dumps(record)
    session_path.write_text("\n".join(older) + "\n")
    before = Conversation(harmony, ChatSettings(temperature=0.0, max_new_tokens=6, reasoning_effort="high"),
                          record=False)
    resume(before, sessions.read_session(session_path), ChatFlags())
    assert before.effort == "high" and len(before.turns) == 2


def test_the_repl_sets_and_cycles_the_effort_and_shows_it(harmony, data_dir):
    import io

    from dflash_tui.core.conversation import ChatSettings, Conversation
    from dflash_tui.repl import Repl

    conv = Conversation(harmony, ChatSettings(temperature=0.0, max_new_tokens=4), record=False)
    err = io.StringIO()
    repl = Repl(conv, out=io.StringIO(), err=err, colour=False)
    repl.run_piped(io.StringIO("/thinking high\n/thinking\n/thinking off\nWhat is 48 + 75?\n"))
    assert err.getvalue().splitlines()[:3] == ["effort high", "effort low",
                                               "usage: /thinking [low|medium|high] (no argument: the next level)"]
    assert "effort low" in repl.status() and "\nReasoning: low\n" in harmony.decode(conv.turns[0].prompt_ids)


@pytest.mark.asyncio
async def test_the_tui_shows_the_effort_cycles_it_and_splits_a_resumed_reply(harmony, harmony_pair, data_dir,
                                                                             tmp_path):
    pytest.importorskip("textual")
    from dflash_tui.tui.widgets import AnswerView
    from dflash_tui.tui.widgets.header import ChatHeader
    from tests.tiny import write_profile
    from tests.tui_helpers import SIZE, make_app, ready, recorded_turn, write_session

    profile = write_profile(tmp_path / "harmony.toml", *harmony_pair, max_new_tokens=6,
                            extra='reasoning_effort = "high"\n')
    session = write_session("20260101-100000-0001", recorded_turn(harmony, "What is 48 + 75?", SHOWN))
    from dflash_tui.core import sessions

    app = make_app(profile, harmony, resume=sessions.load_session(session))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        header = app.screen.query_one(ChatHeader)
        assert "effort high" in header.query_one("#header-state").render().plain
        answer = app.screen.query(AnswerView).last()
        assert (answer.thinking_text, answer.answer_text) == (ANALYSIS, FINAL)
        await pilot.press("ctrl+t")
        await pilot.pause()
        assert app.conversation.effort == "low" and "effort low" in header.query_one(
            "#header-state").render().plain
        assert app.conversation.messages_for("next", app.conversation.turns)[1] == HARMONY.history(SHOWN)


# -- dflash serve --------------------------------------------------------------------------------------------


def test_serve_splits_analysis_into_reasoning_content_streamed_and_whole(harmony):
    """The serve shaping (stop strings, the harmony split, the chunks) over the steps a known reply streams."""
    texts = streamed_text(harmony, SHOWN)
    whole = serve_run(harmony, texts, False, HARMONY.splitter())["choices"][0]
    assert whole["message"]["reasoning_content"] == ANALYSIS and whole["message"]["content"] == FINAL
    assert whole["finish_reason"] == "stop"
    chunks = serve_run(harmony, texts, True, HARMONY.splitter())
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == ANALYSIS
    assert "".join(d.get("content", "") for d in deltas) == FINAL
    assert len([d for d in deltas if d.get("reasoning_content")]) > 1  # streamed, not held to the end


@pytest.fixture
def harmony_server(harmony):
    """The serve app (starlette on uvicorn, on a loopback port) in front of the loaded harmony engine, as
    `dflash serve` runs it in process; the served profile's default effort is low."""
    pytest.importorskip("httpx")
    uvicorn = pytest.importorskip("uvicorn")
    import threading
    import time
    from types import SimpleNamespace

    from dflash_tui.serve.app import ServeState, build_app
    from dflash_tui.serve.metrics import Metrics
    from dflash_tui.serve.worker import EngineWorker
    from tests import waiting
    from tests.test_serve import free_port

    metrics = Metrics("tiny", harmony.block_size)
    worker = EngineWorker(harmony, metrics=metrics)
    state = ServeState(engine=harmony, worker=worker, metrics=metrics, names=["tiny"],
                       defaults={"max_new_tokens": 8, "temperature": 0.0, "reasoning_effort": "low"})
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(state), host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    end = time.monotonic() + waiting.limit()
    while not server.started:  # the socket is bound and listening
        assert thread.is_alive() and time.monotonic() < end, "the server never started"
        time.sleep(0.02)
    try:
        yield SimpleNamespace(root=f"http://127.0.0.1:{port}", base=f"http://127.0.0.1:{port}/v1")
    finally:
        server.should_exit = True
        thread.join()
        worker.close()


def test_serve_takes_the_effort_and_answers_a_forced_harmony_call_end_to_end(harmony, harmony_server):
    """`dflash serve` on the harmony pair, over HTTP: reasoning_effort reaches the rendered prompt (the profile's
    when the request has none; a bad value is a 400 naming it); tools and the tool history render through the
    published template; a named tool_choice opens the call's message and the grammar of the tool's parameters
    (its one enumerated city) makes the random model write a valid call and end it: a tool call, streamed and
    whole."""
    import httpx

    from tests.test_serve import HISTORY, TOOLS, sse_chunks

    server = harmony_server

    def prompt(**extra) -> str:
        reply = httpx.post(server.root + "/tokenize", json={"model": "tiny", "messages": QUESTION, **extra},
                           timeout=60)
        assert reply.status_code == 200, reply.text
        return harmony.decode(reply.json()["tokens"])

    assert "\nReasoning: high\n" in prompt(reasoning_effort="high")
    assert "\nReasoning: low\n" in prompt()  # the served profile's
    assert "\nReasoning: medium\n" in prompt(chat_template_kwargs={"reasoning_effort": "medium"})
    bad = httpx.post(server.base + "/chat/completions", json={"messages": QUESTION, "reasoning_effort": "max"},
                     timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "reasoning_effort"
    tools_prompt = harmony.tokenizer.decode(httpx.post(server.root + "/tokenize", json={  # every token shown
        "model": "tiny", "messages": HISTORY, "tools": TOOLS}, timeout=60).json()["tokens"])
    assert "type get_weather = (_: {\ncity: string,\n}) => any;" in tools_prompt
    assert ('<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}'
            '<|call|><|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"18 C, sunny"'
            '<|end|><|start|>assistant') in tools_prompt

    paris = [{"type": "function", "function": {"name": "get_weather", "description": "The weather.", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris"]}}, "required": ["city"],
        "additionalProperties": False}}}]
    body = {"model": "tiny", "messages": QUESTION, "tools": paris, "max_tokens": 120, "temperature": 0,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    reply = httpx.post(server.base + "/chat/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    whole = reply.json()["choices"][0]
    assert whole["finish_reason"] == "tool_calls" and whole["message"]["content"] is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in whole["message"]["tool_calls"]] \
        == [("get_weather", {"city": "Paris"})]
    with httpx.stream("POST", server.base + "/chat/completions", json=body | {"stream": True},
                      timeout=60) as response:
        chunks = sse_chunks(response)
    calls = [d for c in chunks if c["choices"] for d in c["choices"][0]["delta"].get("tool_calls") or []]
    assert calls[0]["function"] == {"name": "get_weather", "arguments": ""} and calls[0]["id"].startswith("call_")
    assert json.loads("".join(c["function"].get("arguments", "") for c in calls[1:])) == {"city": "Paris"}
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"
