"""A small client for OpenAI-compatible servers (httpx), with each failure as one sentence.

`base` is the API root a user passes (`http://HOST:PORT/v1`); `root` is the server root where vLLM,
SGLang and llama.cpp keep their own routes (`/tokenize`, `/metrics`, `/generate`, `/health`).
"""

from __future__ import annotations

import contextlib
import json
from typing import Iterator, Optional
from urllib.parse import urlsplit

from dflash_tui.engines.errors import UserError, parse_json
from dflash_tui.engines.remote.sse import iter_sse_json

SMALL_TIMEOUT_S = 30.0


class RemoteError(UserError):
    """The server could not be reached, or answered with an error (one sentence)."""

    def __init__(self, message: str, status: Optional[int] = None):
        super().__init__(message)
        self.status = status


def split_url(url: str) -> tuple[str, str]:
    """(base, root) for a URL given with or without `/v1` (and with or without a trailing slash). A URL
    the network layer would refuse, or send somewhere else than it reads, is one sentence here."""
    url = url.strip().rstrip("/")
    fix = "pass one like http://127.0.0.1:8000/v1"
    if any(c.isspace() or not c.isprintable() for c in url):
        raise UserError(f"The server URL {url!r} holds a space or a control character; {fix}.")
    try:
        parts = urlsplit(url)
        _ = parts.port  # a port that is no number, or out of range, raises here
    except ValueError as exc:
        raise UserError(f"The server URL {url!r} is not a valid URL ({exc}); {fix}.") from None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UserError(f"The server URL {url!r} is not an http(s) URL; {fix}.")
    if not parts.hostname:
        raise UserError(f"The server URL {url!r} has no host; {fix}.")
    if "?" in url or "#" in url:
        raise UserError(f"The server URL {url!r} has a query or a fragment, which dflash cannot put its routes "
                        f"after; {fix}.")
    if url.endswith("/v1"):
        return url, url[: -len("/v1")]
    return url + "/v1", url


def error_text(body: bytes) -> str:
    """The message of an error body: OpenAI's {"error": {"message"}}, FastAPI's {"detail"}, or the text."""
    try:
        data = parse_json(body)
    except ValueError:
        return body.decode("utf-8", "replace").strip()[:200] or "no message"
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            message = err.get("message") or err.get("detail") or err.get("msg")
            if message:
                return str(message)
        elif isinstance(err, str):
            return err
        if "detail" in data:
            return str(data["detail"])
    return json.dumps(data)[:200]


class Client:
    def __init__(self, url: str, api_key: Optional[str] = None):
        import httpx

        self.base, self.root = split_url(url)
        self.host = urlsplit(self.base).netloc
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._httpx = httpx
        self.http = httpx.Client(headers=headers, timeout=httpx.Timeout(SMALL_TIMEOUT_S, connect=5.0))

    def url(self, path: str, root: bool = False) -> str:
        return (self.root if root else self.base) + path

    def _fail(self, exc: Exception, url: str) -> RemoteError:
        if isinstance(exc, self._httpx.ConnectError):
            return RemoteError(f"No server answers at {url} ({exc}); start one (`dflash serve`) or check --url.")
        if isinstance(exc, self._httpx.TimeoutException):
            return RemoteError(f"The server at {url} did not answer in time ({type(exc).__name__}); check that it is up.")
        return RemoteError(f"The request to {url} failed ({type(exc).__name__}: {exc}).")

    def _check(self, response, url: str) -> None:
        if response.status_code >= 400:
            response.read()
            hint = " (pass --api-key or set DFLASH_API_KEY)" if response.status_code == 401 else ""
            raise RemoteError(f"The server at {url} answered {response.status_code}: "
                              f"{error_text(response.content)}{hint}", response.status_code)

    def _json(self, method: str, path: str, body: Optional[dict], root: bool) -> dict:
        url = self.url(path, root)
        try:
            response = self.http.request(method, url, json=body)
        except self._httpx.HTTPError as exc:
            raise self._fail(exc, url) from None
        self._check(response, url)
        try:
            return response.json()
        except ValueError:
            raise RemoteError(f"The server at {url} answered with something that is not JSON.") from None

    def get_json(self, path: str, root: bool = False) -> dict:
        return self._json("GET", path, None, root)

    def get_text(self, path: str, root: bool = False) -> Optional[str]:
        """A text route that may be absent (None on any failure: used for optional extras like /metrics)."""
        try:
            response = self.http.get(self.url(path, root))
        except self._httpx.HTTPError:
            return None
        return response.text if response.status_code == 200 else None

    def post_json(self, path: str, body: dict, root: bool = False) -> dict:
        return self._json("POST", path, body, root)

    @contextlib.contextmanager
    def stream(self, path: str, body: dict, root: bool = False) -> Iterator[Iterator[dict]]:
        """The JSON events of a streamed POST; leaving the block closes the connection (which a
        server takes as a cancel)."""
        url = self.url(path, root)
        timeout = self._httpx.Timeout(SMALL_TIMEOUT_S, connect=5.0, read=None)  # a long prefill is silent
        try:
            with self.http.stream("POST", url, json=body, timeout=timeout) as response:
                self._check(response, url)
                yield self._events(response, url)
        except self._httpx.HTTPError as exc:
            raise self._fail(exc, url) from None

    def _events(self, response, url: str) -> Iterator[dict]:
        try:
            for event in iter_sse_json(response.iter_lines()):
                if isinstance(event, dict) and "error" in event and not event.get("choices"):
                    raise RemoteError(f"The server at {url} stopped with an error: {error_text(json.dumps(event).encode())}")
                yield event
        except ValueError as exc:
            raise RemoteError(f"The server at {url} sent a broken stream: {exc}.") from None

    def close(self) -> None:
        self.http.close()


def parse_prometheus(text: str) -> dict[str, float]:
    """Sample name -> value summed over label sets, read by prometheus_client's parser (escaped labels
    and all); a server's text it cannot parse gives what was read before it."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out[sample.name] = out.get(sample.name, 0.0) + float(sample.value)
    except ValueError:
        pass
    return out
