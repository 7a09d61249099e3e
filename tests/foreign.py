"""A small OpenAI-compatible server that is not `dflash serve`, on loopback, standing in for vLLM, SGLang,
llama.cpp or mlx_lm.server (none of which runs here). Standard library only, in a thread of the test process.

It answers what such servers answer and nothing more: `/v1/models` (no dflash extension, no context size),
streamed `/v1/chat/completions` and `/v1/completions` (the answer in text chunks, then a usage chunk, no
token ids), and vLLM's `/tokenize` (one made-up id per word); every other route is a 404 (no metrics). So
the remote engine must say that tau, the steps, the block size, peak memory and the prompt's cache reuse
are unknown.

`speculates="vllm"` or `"llama.cpp"` makes it a server that runs speculative decoding of its own and counts
it the way that server does: vLLM's spec-decode counters on the root `/metrics` (advanced by each answer),
llama.cpp's `draft_n` / `draft_n_accepted` in the last chunk's `timings` (and its `/apply-template` and
`/tokenize` routes). Each answer of N tokens counts SPEC_STEPS(N) steps drafting SPEC_BLOCK - 1 tokens each.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "foreign-model"
ANSWER = ["Hello", " from", " a", " foreign", " server", "."]
PROMPT_TOKENS = 9  # what its usage chunk says the prompt was
SPEC_BLOCK = 8  # the block size a speculating stand-in reports


def spec_steps(tokens: int) -> int:
    """The verify steps a speculating stand-in says an answer of `tokens` took (the prefill's token is not
    a step): two, or one for an answer of two tokens or fewer."""
    return 1 if tokens <= 2 else 2


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # one request per connection; the stream ends when the connection closes

    def log_message(self, *args) -> None:  # quiet
        pass

    def _json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/metrics" and self.server.speculates == "vllm":
            counts = self.server.counts
            text = "".join(f"vllm:{name}_total{{engine=\"0\"}} {value}\n" for name, value in counts.items())
            data = text.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        elif self.path == "/v1/models" and self.server.models_fail:  # as mlx_lm.server's does in one set-up
            self._json(500, {"error": {"message": "Internal Server Error"}})
        elif self.path == "/v1/models":
            owner = self.server.speculates or "someone"
            self._json(200, {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": owner}]})
        else:
            self._json(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        self.server.requests.append((self.path, body))
        if self.path == "/tokenize":  # vLLM's: the prompt's ids (here one per word, as if a tokenizer ran)
            text = body.get("prompt") or body.get("content") or " ".join(str(m.get("content"))
                                                                        for m in body.get("messages") or [])
            self._json(200, {"tokens": [10 + n for n, _ in enumerate(str(text).split())], "count": 0})
            return
        if self.path == "/apply-template" and self.server.speculates == "llama.cpp":
            self._json(200, {"prompt": " ".join(str(m.get("content")) for m in body["messages"])})
            return
        if self.path not in ("/v1/chat/completions", "/v1/completions"):
            self._json(404, {"error": {"message": f"no route {self.path}"}})
            return
        if self.server.answers_fail:
            self._json(500, {"error": {"message": "the model crashed"}})
            return
        chat = self.path == "/v1/chat/completions"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        pieces = ANSWER[: max(1, int(body.get("max_tokens") or len(ANSWER)))]
        for n, piece in enumerate(pieces):
            last = n == len(pieces) - 1
            choice = {"index": 0, "finish_reason": ("stop" if len(pieces) == len(ANSWER) else "length") if last else None}
            choice.update({"delta": {"content": piece}} if chat else {"text": piece})
            self._event({"id": "x", "model": MODEL, "choices": [choice]})
        n = len(pieces)
        steps, accepted = spec_steps(n), n - 1 - spec_steps(n)
        last = {"id": "x", "model": MODEL, "choices": [],
                "usage": {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": n, "total_tokens": PROMPT_TOKENS + n}}
        if self.server.speculates == "llama.cpp":
            last["timings"] = {"predicted_n": n, "draft_n": steps * (SPEC_BLOCK - 1), "draft_n_accepted": accepted}
        elif self.server.speculates == "vllm":
            for name, value in (("spec_decode_num_drafts", steps), ("spec_decode_num_draft_tokens",
                                steps * (SPEC_BLOCK - 1)), ("spec_decode_num_accepted_tokens", accepted),
                                ("generation_tokens", n)):
                self.server.counts[name] = self.server.counts.get(name, 0) + value
        self._event(last)
        self.wfile.write(b"data: [DONE]\n\n")

    def _event(self, data: dict) -> None:
        self.wfile.write(f"data: {json.dumps(data)}\n\n".encode())
        self.wfile.flush()


class ForeignServer:
    """`with ForeignServer() as server:` serves on a free loopback port; `server.base` is its /v1 URL and
    `server.requests` the (path, body) of every POST it was sent. `models_fail`: /v1/models answers 500;
    `answers_fail`: every completion answers 500; `speculates`: "vllm" or "llama.cpp" (module docstring)."""

    def __init__(self, models_fail: bool = False, answers_fail: bool = False, speculates: str = ""):
        self.models_fail, self.answers_fail, self.speculates = models_fail, answers_fail, speculates

    def __enter__(self) -> "ForeignServer":
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.models_fail = self.models_fail
        self.httpd.answers_fail = self.answers_fail
        self.httpd.speculates = self.speculates
        self.httpd.counts = {}
        self.httpd.daemon_threads = True
        self.httpd.requests = []
        self.requests = self.httpd.requests
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="foreign-server", daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)
