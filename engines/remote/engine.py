"""The `remote` engine: the engine contract over any OpenAI-compatible server.

Against `dflash serve` every chunk carries the engine's own step (`engines.remote.wire`), so the events
and the Summary are exactly those of a local engine. Against other servers it shows what they report
and lists the rest in `unknown` (and in `warnings`, which front ends show at load); in the Summary each
of those figures is None (unknown, never a made-up 0), and `reports_steps` is False: the events are the
server's text chunks, not verify steps:

- vLLM: token ids with `return_token_ids`; tau from the server-wide spec-decode counters on the root
  `/metrics` (labelled approximate when other requests ran meanwhile);
- SGLang: its native `/generate` (raw prompt, so the chat template is applied here with the target's
  tokenizer from the local HF cache) returns `meta_info.spec_verify_ct`, which gives tau;
- llama.cpp: text, and tau and block size from the drafted and accepted counts in its response timings;
- mlx_lm.server: text and timings only.

Prompt ids (sessions record them, history trimming counts them, replay resends them) come from the
server's tokenize route (ours, vLLM's `/tokenize`, llama.cpp's `/apply-template` + `/tokenize`) or the
target's tokenizer in the local HF cache; with neither, `token_ids_known` is False and replay is refused.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from dflash_tui.engines.config import EngineConfig, GenerationRequest
from dflash_tui.engines.errors import UserError
from dflash_tui.engines.events import StepEvent, Summary, acceptance_histogram
from dflash_tui.engines.guided import Constraint
from dflash_tui.engines.remote.client import Client, RemoteError, parse_prometheus
from dflash_tui.engines.remote.thinking import ThinkingJoiner
from dflash_tui.engines.remote.wire import EXTENSION, step_from_wire, summary_from_wire

KINDS = {"dflash": "dflash", "vllm": "vllm", "sglang": "sglang", "llamacpp": "llama.cpp", "llama.cpp": "llama.cpp"}
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "merges.txt",
                   "special_tokens_map.json", "added_tokens.json", "chat_template.jinja", "chat_template.json",
                   "generation_config.json", "config.json"]


@dataclass
class RemoteConfig:
    """Where the server is. An `EngineConfig` carrying `url` / `model` / `api_key` works as well."""

    url: str
    model: Optional[str] = None  # None: the first model the server lists
    api_key: Optional[str] = None  # None: DFLASH_API_KEY, else OPENAI_API_KEY, else none
    engine: str = "remote"
    source: str = "command line"


class RemoteTarget:
    """What front ends read of a target, as far as the server tells it."""

    vocab_size: Optional[int] = None  # no server says: token ids from a client are the server's to check

    def __init__(self, path: str, max_positions: Optional[int], stop_ids: list[int], generation_config: dict):
        self.path, self.max_positions = path, max_positions
        self._stop_ids, self._generation_config = list(stop_ids), dict(generation_config)

    def stop_ids(self) -> list[int]:
        return list(self._stop_ids)

    def generation_config(self) -> dict:
        return dict(self._generation_config)


class RemoteDraft:
    """What front ends read of a draft: the server's path for it (or the name it was given)."""

    arch: Optional[str] = None  # no server says whether its draft is DFlash 1 or 2

    def __init__(self, path: str):
        self.path = path


def server_kind(card: dict) -> str:
    owner = str(card.get("owned_by") or "").lower()
    if EXTENSION in card:
        return "dflash"
    return KINDS.get(owner, "openai-compatible")


def _import_transformers_quietly() -> None:
    """Import transformers without its import-time advice that PyTorch was not found: an MLX-only install
    lacks torch by design, and the remote engine takes only the tokenizer from transformers. The switch is
    transformers' own (TRANSFORMERS_NO_ADVISORY_WARNINGS, read as it advises), set for the import alone. A
    bare install has no transformers: the ImportError comes from load_tokenizer, which handles it."""
    if "transformers" in sys.modules:
        return
    saved = os.environ.get("TRANSFORMERS_NO_ADVISORY_WARNINGS")
    os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = "1"
    try:
        import transformers  # noqa: F401
    except ImportError:
        pass
    finally:
        if saved is None:
            os.environ.pop("TRANSFORMERS_NO_ADVISORY_WARNINGS", None)
        else:
            os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = saved


def local_tokenizer(names: list[Optional[str]]):
    """The target's tokenizer from a local directory or the local HF cache (never the network), or None."""
    from dflash_tui.engines.prompting import load_tokenizer

    for name in dict.fromkeys(n for n in names if n):
        path = Path(name).expanduser()
        if not path.is_dir():
            try:
                from huggingface_hub import snapshot_download

                path = Path(snapshot_download(name, local_files_only=True, allow_patterns=TOKENIZER_FILES))
            except Exception:  # noqa: BLE001 - not cached, or not a hub id
                continue
        if not any((path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
            continue
        _import_transformers_quietly()
        try:
            return load_tokenizer(path)
        except (UserError, ImportError):  # a bare install has no transformers: ids come from the server, or not at all
            continue
    return None


def _delta_text(previous: str, now: str) -> tuple[str, str]:
    """(new text, text so far) for a stream that may send cumulative or incremental text (SGLang)."""
    if previous and now.startswith(previous):
        return now[len(previous):], now
    return now, previous + now


IDS_SERVERS = ("dflash", "vllm", "sglang", "llama.cpp")  # their completions take a prompt of token ids


@dataclass
class Speculation:
    """What a foreign server said of its own speculative decoding for one request."""

    tau: float  # mean tokens per verify step (the prefill's token is not a step)
    block_size: Optional[int]  # drafted tokens per step + 1, where the server counts drafted tokens
    shared: bool = False  # counted server-wide while other requests ran (vLLM's counters): approximate


def speculation(before: Optional[dict], after: Optional[dict], timings: dict, generated: int) -> Optional[Speculation]:
    """tau and block size from vLLM's spec-decode counters around one request (`before`/`after`, from
    /metrics) or llama.cpp's response timings (`draft_n`, `draft_n_accepted`); None when neither speculated.
    llama.cpp reports no step count: every step emits its accepted tokens plus one, after the prefill's
    token, so steps = generated - 1 - accepted."""
    if before and after and after["drafts"] > before["drafts"]:
        steps = after["drafts"] - before["drafts"]
        drafted = after["drafted"] - before["drafted"]
        return Speculation(1 + (after["accepted"] - before["accepted"]) / steps,
                           1 + round(drafted / steps) if drafted else None,
                           after["generated"] - before["generated"] > generated + 1)
    drafted, accepted = timings.get("draft_n"), timings.get("draft_n_accepted")
    if not drafted or accepted is None:
        return None
    steps = max(generated - 1 - int(accepted), 1)
    return Speculation((generated - 1) / steps, 1 + round(drafted / steps))


def constraint_fields(constraint: Constraint) -> dict:
    """A constraint as the request field every OpenAI-compatible server with structured outputs reads:
    `response_format` for a JSON schema (OpenAI's own), vLLM's `structured_outputs` for the rest (SGLang and
    dflash serve take it too)."""
    if constraint.kind == "json":
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": constraint.value}}}
    return {"structured_outputs": {constraint.kind: constraint.value}}


def penalty_fields(request: GenerationRequest) -> dict:
    """The request's penalties and logit_bias as the OpenAI-compatible servers take them (JSON object
    keys are strings), only those set: a server that does not know a field never sees it unasked."""
    fields = {key: getattr(request, key) for key in ("presence_penalty", "frequency_penalty", "repetition_penalty")
              if getattr(request, key) is not None}
    if request.logit_bias:
        fields["logit_bias"] = {str(token): bias for token, bias in request.logit_bias.items()}
    return fields


class RemoteEngine:
    """The engine contract (`prepare`, `generate`, `last_summary`, names and sizes) over HTTP."""

    name = "remote"

    def __init__(self, config: EngineConfig):
        self.config = config
        url = getattr(config, "url", None)
        if not url:
            raise UserError("The remote engine needs a server: pass --url http://HOST:PORT/v1 (or set url in the "
                            "profile's [engines.remote] table).")
        api_key = getattr(config, "api_key", None) or os.environ.get("DFLASH_API_KEY") or os.environ.get("OPENAI_API_KEY")
        self.client = Client(url, api_key)
        self.url = self.client.base
        self.listing_error: Optional[str] = None
        wanted = getattr(config, "model", None)
        cards = self._cards(wanted)
        card = next((c for c in cards if c["id"] == wanted), None) if wanted else cards[0]
        if card is None:
            names = ", ".join(c["id"] for c in cards)
            raise UserError(f"The server at {self.url} does not serve model {wanted!r}; it serves {names}; "
                            "pass one of those with --model.")
        self.model = card["id"]
        self.kind = server_kind(card)
        self.info: dict = card.get(EXTENSION) or {}
        self.warnings: list[str] = []
        self.unknown: list[str] = []
        self.last_notes: list[str] = []
        self.last_summary: Optional[Summary] = None
        max_len = card.get("max_model_len") or self.info.get("max_model_len") or self._llamacpp_context()
        target = self.info.get("target") or card.get("root") or self.model
        self.generation_config = dict(self.info.get("generation_config") or {})
        self.target_info = RemoteTarget(self.info.get("target_path") or target, max_len,
                                        self.info.get("stop_ids") or [], self.generation_config)
        draft = self.info.get("draft")
        self.draft_info = RemoteDraft(self.info.get("draft_path") or draft) if draft else None
        # what a request without a block size asks for: the one given here (-b), else the server's default
        self.requested_block_size: Optional[int] = getattr(config, "block_size", None)
        self.requested_draft_window: Optional[int] = getattr(config, "draft_window", None)
        self.block_size = int(self.requested_block_size or self.info.get("block_size") or 1)
        self.trained_block_size = self.info.get("trained_block_size")
        self.dtype = self.info.get("dtype", "?")
        server_engine = f"{self.info.get('engine', '?')} on {self.info.get('device', '?')}" if self.info else self.kind
        self.device = f"{self.client.host} ({server_engine})"
        self.tokenizer = None
        if self.kind != "dflash":
            self.tokenizer = local_tokenizer([card.get("root"), self.model])
        self._tokenize_route: Optional[str] = None
        self.token_ids_known = True
        self._check_ids()
        if not max_len:
            self.unknown.append("context size (history is not trimmed)")
        if self.kind != "dflash":
            self.unknown += ["drafted and rejected tokens (text shows as the target's)", "per-step acceptance",
                             "block size", "peak memory", "prompt cache reuse"]
            if self.kind not in ("vllm", "sglang", "llama.cpp"):
                self.unknown.append("tau (mean acceptance length)")
            self.warnings.append(f"{self.kind} server at {self.client.host}: unknown here: {'; '.join(self.unknown)}.")
        elif not max_len:
            self.warnings.append(f"The server at {self.client.host} reports no context size; history is not trimmed.")
        self._check_requested()
        if self.listing_error:
            self.warnings.append(f"/v1/models failed at {self.client.host} ({self.listing_error}); using model "
                                 f"{self.model} as given.")

    def _check_requested(self) -> None:
        """-b and --draft-window reach `dflash serve` in the dflash extension of every request; another
        server runs what it was launched with, so say that here instead of ignoring them."""
        block, window = self.requested_block_size, self.requested_draft_window
        if self.kind == "dflash":
            served = self.info.get("draft_window")
            if window is not None and window != served:
                raise UserError(f"The server at {self.client.host} runs draft window {served or 'none'} and cannot "
                                f"change it per request; drop --draft-window {window}, or serve a profile with "
                                f"draft_window = {window}.")
            return
        for flag, value in (("block size", block), ("draft window", window)):
            if value is not None:
                self.warnings.append(f"The {self.kind} server at {self.client.host} runs the {flag} it was launched "
                                     f"with; {flag} {value} cannot be sent to it (set it in the server's launch "
                                     "command: dflash profile serve-command).")

    def _cards(self, wanted: Optional[str]) -> list[dict]:
        """The served models from /v1/models. With a model named (--model), a listing that fails (it
        crashes on some mlx_lm.server set-ups while chat completions work) is not needed: that model is
        used as given, and what only the listing says (context size, the server's kind) stays unknown."""
        try:
            listing = self.client.get_json("/models")
        except RemoteError as exc:
            if not wanted:
                raise
            self.listing_error = str(exc)
            return [{"id": wanted}]
        cards = [c for c in listing.get("data", []) if isinstance(c, dict) and c.get("id")]
        if not cards:
            raise RemoteError(f"The server at {self.url} lists no models at /v1/models.")
        return cards

    @property
    def reports_steps(self) -> bool:
        """`dflash serve` streams its verify steps; other servers stream text chunks, which are not steps:
        front ends show no live tau, acceptance, split or block size for them (docs/engine-contract.md)."""
        return self.kind == "dflash"

    def _llamacpp_context(self) -> Optional[int]:
        """llama.cpp lists no context size on /v1/models; its /props has the slot's n_ctx."""
        if self.kind != "llama.cpp":
            return None
        try:
            props = self.client.get_json("/props", root=True)
            return int((props.get("default_generation_settings") or {}).get("n_ctx") or 0) or None
        except (UserError, TypeError, ValueError):
            return None

    # -- token ids -------------------------------------------------------------------------------
    def _check_ids(self) -> None:
        """Find a way to turn a chat into ids once, at load (ids unknown: prepare returns [])."""
        probe = GenerationRequest(messages=[{"role": "user", "content": "hi"}])
        try:
            self.prepare(probe)
        except UserError:
            pass
        if self._tokenize_route is None:
            self.token_ids_known = False
            self.unknown.append("token ids (no tokenize route and the tokenizer is not in the local HF cache; "
                                "replay is refused)")

    def _tokenize_server(self, request: GenerationRequest) -> list[int]:
        body: dict = {"model": self.model}
        if request.messages is not None:
            body.update(messages=request.messages, add_generation_prompt=True,
                        chat_template_kwargs={"enable_thinking": request.thinking})
        else:
            body.update(prompt=request.prompt, add_special_tokens=False)
        return list(self.client.post_json("/tokenize", body, root=True)["tokens"])

    def _tokenize_llamacpp(self, request: GenerationRequest) -> list[int]:
        if request.messages is not None:
            text = self.client.post_json("/apply-template", {"messages": request.messages, "chat_template_kwargs":
                                                              {"enable_thinking": request.thinking}}, root=True)["prompt"]
        else:
            text = request.prompt
        data = self.client.post_json("/tokenize", {"content": text, "add_special": False, "parse_special": True},
                                     root=True)
        return [t if isinstance(t, int) else t["id"] for t in data["tokens"]]

    def prepare(self, request: GenerationRequest) -> list[int]:
        """The prompt ids a request stands for ([] when this server gives no way to know them)."""
        if request.prompt_ids is not None:
            return list(request.prompt_ids)
        routes = [self._tokenize_route] if self._tokenize_route else ["local", "server", "llamacpp"]
        for route in routes:
            try:
                if route == "local" and self.tokenizer is not None:
                    from dflash_tui.engines.prompting import prompt_ids

                    ids = prompt_ids(self.tokenizer, request)
                elif route == "server" and self.kind in ("dflash", "vllm", "sglang", "openai-compatible"):
                    ids = self._tokenize_server(request)
                elif route == "llamacpp" and self.kind in ("llama.cpp", "openai-compatible"):
                    ids = self._tokenize_llamacpp(request)
                else:
                    continue
            except RemoteError as exc:
                if self._tokenize_route or exc.status in (400, 413, 422) and self.kind == "dflash":
                    raise
                continue
            except (KeyError, TypeError, ValueError):
                continue
            self._tokenize_route = route
            return ids
        return []

    def decode(self, ids) -> str:
        if self.tokenizer is not None:
            return self.tokenizer.decode(ids, skip_special_tokens=True)
        try:
            return self.client.post_json("/detokenize", {"model": self.model, "tokens": list(ids)}, root=True)["prompt"]
        except (UserError, KeyError, TypeError):
            return ""

    def _prompt_text(self, ids: list[int]) -> Optional[str]:
        """Prompt ids as the text a server re-tokenizes into them: special tokens (the chat template's)
        spelled out, through the local tokenizer or the server's /detokenize; None when neither is there
        (the ids are then sent as they are, and a server that refuses them says so)."""
        if self.tokenizer is not None:
            return self.tokenizer.decode(ids, skip_special_tokens=False)
        try:
            return self.client.post_json("/detokenize", {"model": self.model, "tokens": list(ids)}, root=True)["prompt"]
        except (UserError, KeyError, TypeError):
            return None

    def stop_ids(self) -> list[int]:
        return self.target_info.stop_ids()

    # -- baselines: the target alone runs only where the weights are -------------------------------
    baseline_name = "none (remote engine)"

    def baseline_generate(self, prompt_ids: list[int], max_new_tokens: int, temperature: float):
        raise UserError(f"A baseline needs the target's weights, which stay on the server at {self.client.host}; "
                        "compare block sizes instead (block 1 is the target alone).")

    def top2_margin(self, ids: list[int]):
        try:
            from dflash_tui.engines.baseline import Margin
        except ImportError:
            return None
        return Margin()

    def measure_block1(self, steps: int = 4) -> None:
        """Never measured: the server keeps its own caches and runs its own steps, which cannot be timed
        from here (docs/engine-contract.md, "The block-1 probe")."""
        return None

    # -- the server's own: its caches and its process ----------------------------------------------
    def new_context(self) -> None:
        """Nothing kept here: the server keeps its own caches (`dflash serve` reuses them when a request's ids
        share a prefix with the previous request's)."""

    def prepare_steps(self, block_size: int) -> bool:
        """Nothing to make ready here: the server runs its own steps."""
        return False

    # -- generating --------------------------------------------------------------------------------
    def _body(self, request: GenerationRequest) -> tuple[str, dict]:
        body: dict = {"model": self.model, "stream": True, "stream_options": {"include_usage": True},
                      "max_tokens": request.max_new_tokens, "seed": request.seed}
        for key in ("temperature", "top_p", "top_k", "min_p"):
            value = getattr(request, key)
            if value is not None:
                body[key] = value
        body.update(penalty_fields(request))
        if request.messages is not None:
            path = "/chat/completions"
            body["messages"] = request.messages
            body["chat_template_kwargs"] = {"enable_thinking": request.thinking}
        else:
            path = "/completions"
            if request.prompt_ids is None:
                body["prompt"] = request.prompt
            elif self.kind in IDS_SERVERS:
                body["prompt"] = list(request.prompt_ids)
            else:  # mlx_lm.server and other servers take a completion prompt as text only, where it can be had
                text = self._prompt_text(request.prompt_ids)
                body["prompt"] = list(request.prompt_ids) if text is None else text
        if request.constraint is not None:
            body.update(constraint_fields(request.constraint))
        if self.kind == "dflash":
            body[EXTENSION] = {"block_size": request.block_size or self.requested_block_size,
                               "stop_ids": request.stop_ids, "clamp_max_tokens": True,
                               "reuse_cache": request.reuse_cache}
            if self.requested_draft_window is not None:
                body[EXTENSION]["draft_window"] = self.requested_draft_window
        elif self.kind in ("vllm", "sglang"):
            if request.stop_ids is not None:
                body["stop_token_ids"] = list(request.stop_ids)
            if self.kind == "vllm":
                body["return_token_ids"] = True
        return path, body

    def generate(self, request: GenerationRequest) -> Iterator[StepEvent]:
        if request.prompt_ids is not None and not self.token_ids_known:
            raise UserError(f"Replay needs token ids, and the {self.kind} server at {self.client.host} has no tokenize "
                            "route while the target's tokenizer is not in the local HF cache; fetch the tokenizer "
                            "(huggingface-cli download MODEL) or replay on a local engine.")
        self.last_summary = None
        self.last_notes = []
        if self.kind == "dflash":
            return self._generate_dflash(request)
        if self.kind == "sglang" and self.tokenizer is not None:
            return self._generate_sglang(request)
        return self._generate_openai(request)

    def _summary(self, prompt_tokens: int, ids: list[int], text: str, ttft: float, decode_s: float, finish: str,
                 generated: Optional[int] = None, lengths: Optional[list[int]] = None, tau: Optional[float] = None,
                 block_size: Optional[int] = None, draft_s: Optional[float] = None,
                 verify_s: Optional[float] = None) -> Summary:
        """What this side measured (timings, counts); every figure only the server knows and did not tell is
        None: unknown, not zero (peak memory, the prompt's cache reuse, and on a foreign server the steps,
        block size and draft/verify split; tau where it reports no acceptance)."""
        generated = len(ids) if generated is None else generated
        return Summary(
            prompt_tokens=prompt_tokens, generated_tokens=generated, token_ids=ids, text=text, ttft_s=ttft,
            decode_s=decode_s,
            decode_tokens_per_s=(generated - 1) / decode_s if generated > 1 and decode_s > 0 else 0.0,
            acceptance_lengths=lengths, mean_acceptance_length=tau,
            histogram=acceptance_histogram(lengths, block_size or 1) if lengths is not None else None,
            draft_s=draft_s, verify_s=verify_s, peak_memory_bytes=None, peak_memory_kind=None, block_size=block_size,
            engine=self.name, device=self.device, dtype=self.dtype, finish_reason=finish, graphs=None,
            reused_prompt_tokens=None, prefilled_prompt_tokens=None,
        )

    def _generate_dflash(self, request: GenerationRequest) -> Iterator[StepEvent]:
        path, body = self._body(request)
        started = time.perf_counter()
        first_at = None
        events: list[StepEvent] = []
        server_summary = None
        prompt_tokens = 0
        finish = "cancelled"
        with self.client.stream(path, body) as chunks:
            for chunk in chunks:
                ext = chunk.get(EXTENSION) or {}
                usage = chunk.get("usage") or {}
                prompt_tokens = usage.get("prompt_tokens", prompt_tokens)
                if "summary" in ext:
                    server_summary = summary_from_wire(ext["summary"])
                step = ext.get("step")
                if step is not None:
                    event = step_from_wire(step)
                    if first_at is None:
                        first_at = time.perf_counter()
                    events.append(event)
                    if event.finish_reason:
                        finish = event.finish_reason
                    yield event
                if request.cancel.is_set() and finish == "cancelled":
                    break  # leaving the stream closes the connection; the server cancels within one step
        if server_summary is not None:
            server_summary.engine, server_summary.device = self.name, self.device
            self.last_summary = server_summary
            return
        # no Summary from the server (the stream was left early): its steps are known, its memory is not
        ids = [t for e in events for t in e.emitted]
        lengths = [e.accepted + 1 for e in events if not e.is_prefill]
        now = time.perf_counter()
        self.last_summary = self._summary(
            prompt_tokens, ids, "".join(e.text for e in events), (first_at or now) - started, now - (first_at or now),
            finish, lengths=lengths, tau=sum(lengths) / len(lengths) if lengths else 0.0,
            block_size=request.block_size or self.block_size, draft_s=sum(e.draft_s for e in events),
            verify_s=sum(e.verify_s for e in events))

    def _vllm_counters(self) -> Optional[dict]:
        text = self.client.get_text("/metrics", root=True) if self.kind == "vllm" else None
        if not text:
            return None
        raw = parse_prometheus(text)
        get = lambda name: raw.get(name + "_total", raw.get(name, 0.0))  # noqa: E731 - a one-line lookup
        return {"drafts": get("vllm:spec_decode_num_drafts"), "accepted": get("vllm:spec_decode_num_accepted_tokens"),
                "drafted": get("vllm:spec_decode_num_draft_tokens"), "generated": get("vllm:generation_tokens")}

    def _generate_openai(self, request: GenerationRequest) -> Iterator[StepEvent]:
        path, body = self._body(request)
        before = self._vllm_counters()
        joiner = ThinkingJoiner()
        started = time.perf_counter()
        first_at = None
        ids: list[int] = []
        text_parts: list[str] = []
        usage: dict = {}
        timings: dict = {}
        finish = "cancelled"
        with self.client.stream(path, body) as chunks:
            for chunk in chunks:
                usage = chunk.get("usage") or usage
                timings = chunk.get("timings") or timings
                for choice in chunk.get("choices") or []:
                    if "delta" in choice:
                        piece = joiner.add(choice.get("delta") or {})
                    else:
                        piece = choice.get("text") or ""
                    new_ids = list(choice.get("token_ids") or [])
                    reason = choice.get("finish_reason")
                    if reason:
                        finish = "length" if reason == "length" else "stop"
                    if not piece and not new_ids and not reason:
                        continue
                    ids += new_ids
                    text_parts.append(piece)
                    prefill = first_at is None
                    if prefill:
                        first_at = time.perf_counter()
                    yield StepEvent(drafted=[], accepted=0, emitted=new_ids, pieces=[(piece, "target")] if piece else [],
                                    finish_reason=finish if reason else None, is_prefill=prefill)
                if request.cancel.is_set() and finish == "cancelled":
                    break
        now = time.perf_counter()
        after = self._vllm_counters() if before is not None else None
        generated = usage.get("completion_tokens") or timings.get("predicted_n") or len(ids)
        spec = speculation(before, after, timings, generated)
        if spec is None:
            self.last_notes.append("tau unknown: the server does not report acceptance")
        elif spec.shared:
            self.last_notes.append("tau is approximate: other requests ran on the server meanwhile "
                                   "(vLLM's spec-decode counters are server-wide)")
        self.last_summary = self._summary(
            usage.get("prompt_tokens") or len(self.prepare(request)), ids, "".join(text_parts),
            (first_at or now) - started, now - (first_at or now), finish, generated,
            tau=spec.tau if spec else None, block_size=spec.block_size if spec else None)

    def _generate_sglang(self, request: GenerationRequest) -> Iterator[StepEvent]:
        """SGLang's native /generate: prompt ids in, `meta_info.spec_verify_ct` out (tau)."""
        prompt = self.prepare(request)
        params: dict = {"max_new_tokens": request.max_new_tokens}
        for key in ("temperature", "top_p", "top_k", "min_p"):
            if getattr(request, key) is not None:
                params[key] = getattr(request, key)
        if request.stop_ids is not None:
            params["stop_token_ids"] = list(request.stop_ids)
        params.update(penalty_fields(request))
        body = {"input_ids": prompt, "sampling_params": params, "stream": True}
        started = time.perf_counter()
        first_at = None
        text = ""
        ids: list[int] = []
        meta: dict = {}
        finish = "cancelled"
        with self.client.stream("/generate", body, root=True) as chunks:
            for chunk in chunks:
                meta = chunk.get("meta_info") or meta
                piece, text = _delta_text(text, chunk.get("text") or "")
                out = list(chunk.get("output_ids") or [])
                new_ids = out[len(ids):] if out[: len(ids)] == ids and len(out) >= len(ids) else out
                ids = ids + new_ids
                reason = (meta.get("finish_reason") or {}).get("type") if isinstance(meta.get("finish_reason"), dict) \
                    else meta.get("finish_reason")
                if reason:
                    finish = "length" if reason == "length" else ("cancelled" if reason == "abort" else "stop")
                if not piece and not new_ids and not reason:
                    continue
                prefill = first_at is None
                if prefill:
                    first_at = time.perf_counter()
                yield StepEvent(drafted=[], accepted=0, emitted=new_ids, pieces=[(piece, "target")] if piece else [],
                                finish_reason=finish if reason else None, is_prefill=prefill)
                if request.cancel.is_set() and not reason:
                    break
        now = time.perf_counter()
        generated = meta.get("completion_tokens") or len(ids)
        verify = meta.get("spec_verify_ct") or 0
        tau = generated / verify if verify else (float(meta["spec_accept_length"]) if meta.get("spec_accept_length")
                                                 else None)
        if tau is None:
            self.last_notes.append("tau unknown: the server reported no spec_verify_ct")
        self.last_summary = self._summary(
            meta.get("prompt_tokens") or len(prompt), ids, text, (first_at or now) - started,
            now - (first_at or now), finish, generated, tau=tau)

    def close(self) -> None:
        self.client.close()

    def kill(self) -> None:
        """Nothing runs apart from this process: the server goes on, and this process's exit drops the connection."""
