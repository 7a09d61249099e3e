"""The DFlash extension fields `dflash serve` adds to OpenAI responses, written and read in one place.

Standard clients ignore unknown fields; the remote engine reads them to rebuild the exact `StepEvent`s
and `Summary` a local engine would have produced:

- each streamed chunk: `"dflash": {"step": {...}}` with `accepted`, `drafted`, `emitted`, `origins`
  (one per emitted id), `pieces` ([text, origin] pairs of the raw text, thinking tags included),
  `rejected`, `rejected_text`, `draft_s`, `verify_s`, `loop_s`, `prefill`, `finish_reason`;
- the last chunk (and a non-streamed response): `"dflash": {"summary": {...}}`, the engine's Summary;
- a request may carry `"dflash": {"block_size": n, "stop_ids": [...], "draft_window": w, "reuse_cache": bool,
  "clamp_max_tokens": bool}`: `stop_ids` replaces the eos ids (OpenAI's `stop_token_ids` adds to them),
  `draft_window` must equal the server's own (it cannot change per request), `reuse_cache` overrides the
  server's --prefix-reuse, `clamp_max_tokens` cuts a max_tokens beyond the context instead of a 400.
"""

from __future__ import annotations

from typing import Optional

from dflash_tui.engines.events import StepEvent, Summary

EXTENSION = "dflash"


def origins_of(event: StepEvent) -> list[str]:
    n = len(event.emitted)
    accepted = min(event.accepted, n)
    return ["draft"] * accepted + ["target"] * (n - accepted)


def step_to_wire(event: StepEvent) -> dict:
    return {
        "prefill": event.is_prefill, "accepted": event.accepted, "drafted": list(event.drafted),
        "emitted": list(event.emitted), "origins": origins_of(event),
        "pieces": [[text, origin] for text, origin in event.pieces],
        "rejected": list(event.rejected), "rejected_text": event.rejected_text,
        "draft_s": event.draft_s, "verify_s": event.verify_s, "loop_s": event.loop_s,
        "finish_reason": event.finish_reason,
    }


def step_from_wire(data: dict) -> StepEvent:
    return StepEvent(
        drafted=list(data.get("drafted") or []), accepted=int(data.get("accepted") or 0),
        emitted=list(data.get("emitted") or []),
        pieces=[(str(text), str(origin)) for text, origin in data.get("pieces") or []],
        rejected=list(data.get("rejected") or []), rejected_text=data.get("rejected_text") or "",
        draft_s=float(data.get("draft_s") or 0.0), verify_s=float(data.get("verify_s") or 0.0),
        loop_s=float(data.get("loop_s") or 0.0),
        finish_reason=data.get("finish_reason"), is_prefill=bool(data.get("prefill")),
    )


def summary_from_wire(data: dict) -> Optional[Summary]:
    """A Summary from a server of any contract version (unknown keys ignored, missing ones filled)."""
    try:
        return Summary.from_dict(data)
    except (TypeError, ValueError):
        return None
