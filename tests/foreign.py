"""A small OpenAI-compatible server that is not `dflash serve`, on loopback, standing in for vLLM, SGLang,
llama.cpp or mlx_lm.server (none of which runs here). Standard library only, in a thread of the test process.

It answers what such servers answer and nothing more: `/v1/models` (no dflash extension, no context size),
streamed `/v1/chat/completions` and `/v1/completions` (the answer in text chunks, then a usage chunk, no
token ids), and vLLM's `/tokenize` (one made-up id per word); every other route is a 404 (no metrics). So
the remote engine must say that tau, the steps, the block size, peak memory and the prompt's cache reuse
are unknown.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "foreign-model"
ANSWER = ["Hello", " from", " a", " foreign", " server", "."]
PROMPT_TOKENS = 9  # what its usage chunk says the prompt was


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
        if self.path == "/v1/models" and self.server.models_fail:  # as mlx_lm.server's does in one set-up
            self._json(500, {"error": {"message": "Internal Server Error"}})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "someone"}]})
        else:
            self._json(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        self.server.requests.append((self.path, body))
        if self.path == "/tokenize":  # vLLM's: the prompt's ids (here one per word, as if a tokenizer ran)
            text = body.get("prompt") or " ".join(str(m.get("content")) for m in body.get("messages") or [])
            self._json(200, {"tokens": [10 + n for n, _ in enumerate(str(text).split())], "count": 0})
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
        self._event({"id": "x", "model": MODEL, "choices": [],
                     "usage": {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": len(pieces),
                               "total_tokens": PROMPT_TOKENS + len(pieces)}})
        self.wfile.write(b"data: [DONE]\n\n")

    def _event(self, data: dict) -> None:
        self.wfile.write(f"data: {json.dumps(data)}\n\n".encode())
        self.wfile.flush()


class ForeignServer:
    """`with ForeignServer() as server:` serves on a free loopback port; `server.base` is its /v1 URL and
    `server.requests` the (path, body) of every POST it was sent. `models_fail`: /v1/models answers 500;
    `answers_fail`: every completion answers 500."""

    def __init__(self, models_fail: bool = False, answers_fail: bool = False):
        self.models_fail, self.answers_fail = models_fail, answers_fail

    def __enter__(self) -> "ForeignServer":
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.models_fail = self.models_fail
        self.httpd.answers_fail = self.answers_fail
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
