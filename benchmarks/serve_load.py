"""`dflash serve` under load: concurrent streaming clients, time to first token and aggregate tokens/s.

    python benchmarks/serve_load.py                        # starts `dflash serve` on the demo profile
    python benchmarks/serve_load.py --profile qwen3-8b     # another profile
    python benchmarks/serve_load.py --url http://127.0.0.1:8000/v1 [--api-key KEY]   # a running server
                                                           # (ours, vLLM, SGLang: any OpenAI-compatible one)

Each client sends its requests one after another over its own connection, all clients at once. The
server has one engine and answers one request at a time, so time to first token (TTFT, from sending
the request to the first streamed token) includes the wait in the queue: p50 / p95 grow with the
number of clients while the aggregate rate stays near the engine's single-stream rate. Every answer
is checked: one finish_reason per request, and (against `dflash serve`) the streamed step ids equal
the summary's ids. Loopback only unless --url says otherwise.

The multi-turn rows drive one conversation of --turns turns through the `openai` client, resending the
whole history each turn as agents and chat clients do, with the server's prefix reuse on (the default)
and off (the request's `"dflash": {"reuse_cache": false}`): the time to first token of turns 7-8
against turns 1-2, and how many prompt tokens the server took from its kept caches (cached_tokens).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time

import httpx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPTS = ["What is 48 + 75?", "Sort 5 2 9 1.", "What is 7 * 8?", "Compare 31 and 13.", "What is 120 - 45?",
           "Sort 4 4 1 3."]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def start_server(profile: str, host: str) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind((host, 0))
        port = s.getsockname()[1]
    # eager steps unless the caller says otherwise: with the background compile (serve's default on a CPU) the
    # first requests would share the cores with inductor, which is not the load this measures
    env = {"DFLASH_COMPILE": "0", **{k: v for k, v in os.environ.items() if k != "DFLASH_API_KEY"}}
    proc = subprocess.Popen([sys.executable, "-m", "dflash_tui", "serve", "--profile", profile, "--host", host,
                             "--port", str(port)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    root = f"http://{host}:{port}"
    for _ in range(3000):
        if proc.poll() is not None:
            raise SystemExit(f"dflash serve exited with code {proc.returncode}")
        try:
            if httpx.get(root + "/health", timeout=2).status_code == 200:
                return proc, root + "/v1"
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.terminate()
    raise SystemExit("dflash serve never answered /health")


async def one_request(client: httpx.AsyncClient, base: str, model: str, prompt: str, max_tokens: int) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}, "dflash": {}}
    sent = time.perf_counter()
    first = None
    ids, finishes, usage, summary = [], [], {}, None
    async with client.stream("POST", base + "/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            ext = chunk.get("dflash") or {}
            step = ext.get("step")
            text = any((c.get("delta") or {}).get("content") or (c.get("delta") or {}).get("reasoning_content")
                       for c in chunk.get("choices") or [])
            if first is None and (step or text):
                first = time.perf_counter()
            if step:
                ids += step["emitted"]
            finishes += [c["finish_reason"] for c in chunk.get("choices") or [] if c.get("finish_reason")]
            usage = chunk.get("usage") or usage
            summary = ext.get("summary") or summary
    done = time.perf_counter()
    if len(finishes) != 1:
        raise AssertionError(f"{prompt!r}: {len(finishes)} finish reasons")
    if summary is not None and summary["token_ids"] != ids:
        raise AssertionError(f"{prompt!r}: streamed ids differ from the summary's")
    return {"ttft": (first or done) - sent, "tokens": usage.get("completion_tokens", len(ids)),
            "tau": usage.get("mean_acceptance_length"), "seconds": done - sent}


async def run(base: str, api_key: str | None, clients: int, requests: int, max_tokens: int) -> tuple[list[dict], float]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(600.0), limits=limits) as client:
        model = (await client.get(base + "/models")).json()["data"][0]["id"]
        await one_request(client, base, model, PROMPTS[0], max_tokens)  # warm-up, not counted

        async def client_run(i: int) -> list[dict]:
            return [await one_request(client, base, model, PROMPTS[(i + j) % len(PROMPTS)], max_tokens)
                    for j in range(requests)]

        started = time.perf_counter()
        per_client = await asyncio.gather(*(client_run(i) for i in range(clients)))
        wall = time.perf_counter() - started
    return [r for rows in per_client for r in rows], wall


TURNS = ["What is 48 + 75?", "And 75 + 48?", "Now subtract 13.", "Double it.", "Is that even?",
         "Divide it by 4.", "Round that.", "Add 100 to it.", "What is it times 3?", "Say it in words."]


def multi_turn(base: str, api_key: str | None, turns: int, max_tokens: int, reuse: bool) -> list[dict]:
    """One conversation through the openai client: per turn, TTFT and the reused prompt tokens."""
    import openai

    client = openai.OpenAI(base_url=base, api_key=api_key or "unused", max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    messages: list[dict] = []
    rows = []
    for n in range(turns):
        messages.append({"role": "user", "content": TURNS[n % len(TURNS)]})
        sent = time.perf_counter()
        first, content, cached = None, [], None
        stream = client.chat.completions.create(
            model=model, messages=messages, max_tokens=max_tokens, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"dflash": {"reuse_cache": reuse}})
        for chunk in stream:
            if first is None and chunk.choices:
                delta = chunk.choices[0].delta
                if delta.content or (delta.model_extra or {}).get("reasoning_content"):
                    first = time.perf_counter()
            for choice in chunk.choices:
                content.append(choice.delta.content or "")
            if chunk.usage is not None and chunk.usage.prompt_tokens_details is not None:
                cached = chunk.usage.prompt_tokens_details.cached_tokens
        messages.append({"role": "assistant", "content": "".join(content)})
        rows.append({"ttft": (first or time.perf_counter()) - sent, "cached": cached})
    return rows


def print_multi_turn(base: str, api_key: str | None, turns: int, max_tokens: int) -> None:
    if turns < 8:
        return
    print(f"\nmulti-turn: one conversation of {turns} turns resent whole each turn (openai client)")
    print(f"{'reuse':>5} {'TTFT 1-2':>10} {'TTFT 7-8':>10} {'cached 7-8':>10}")
    late = {}
    for reuse in (True, False):
        rows = multi_turn(base, api_key, turns, max_tokens, reuse)
        early = statistics.mean(r["ttft"] for r in rows[:2])
        late[reuse] = statistics.mean(r["ttft"] for r in rows[6:8])
        cached = [r["cached"] for r in rows[6:8]]
        shown = "?" if None in cached else f"{statistics.mean(cached):.0f}"
        print(f"{'on' if reuse else 'off':>5} {early * 1000:>8.0f}ms {late[reuse] * 1000:>8.0f}ms {shown:>10}")
    print(f"turns 7-8 TTFT, reuse off / on: {late[False] / late[True]:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", help="A running OpenAI-compatible server (…/v1); default: start dflash serve")
    parser.add_argument("--profile", default="demo", help="Profile for the server this script starts")
    parser.add_argument("--api-key", default=os.environ.get("DFLASH_API_KEY"))
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--requests", type=int, default=3, help="Requests per client, one after another")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--turns", type=int, default=8, help="Turns of the multi-turn rows (0: leave them out)")
    args = parser.parse_args()
    proc = None
    base = args.url
    if base is None:
        proc, base = start_server(args.profile, "127.0.0.1")
    try:
        print(f"server {base} · {args.requests} requests per client · max_tokens {args.max_tokens} · temperature 0")
        print(f"{'clients':>7} {'requests':>8} {'p50 TTFT':>10} {'p95 TTFT':>10} {'agg tok/s':>10} {'tau':>6}")
        for clients in args.clients:
            rows, wall = asyncio.run(run(base, args.api_key, clients, args.requests, args.max_tokens))
            ttfts = [r["ttft"] for r in rows]
            taus = [r["tau"] for r in rows if r["tau"]]
            tau = f"{statistics.mean(taus):6.2f}" if taus else f"{'?':>6}"
            print(f"{clients:>7} {len(rows):>8} {percentile(ttfts, 0.5) * 1000:>8.0f}ms "
                  f"{percentile(ttfts, 0.95) * 1000:>8.0f}ms {sum(r['tokens'] for r in rows) / wall:>10.1f} {tau}")
        print_multi_turn(base, args.api_key, args.turns, args.max_tokens)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(15)


if __name__ == "__main__":
    main()
