"""Prometheus metrics for `dflash serve` (text exposition format 0.0.4, no client library needed).

Names follow vLLM's where one exists (`..._time_to_first_token_seconds`, spec-decode counters as
drafts / draft tokens / accepted tokens), with the `dflash:` prefix.
"""

from __future__ import annotations

import threading
from collections import Counter

TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0)


class Metrics:
    def __init__(self, model: str, block_size: int):
        self.model = model
        self.block_size = max(1, block_size)
        self.lock = threading.Lock()
        self.requests: Counter = Counter()  # (route, status) -> count
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.drafts = 0  # verify steps
        self.draft_tokens = 0
        self.accepted_tokens = 0
        self.acceptance: Counter = Counter()  # acceptance length -> steps
        self.ttft: list[int] = [0] * (len(TTFT_BUCKETS) + 1)
        self.ttft_sum = 0.0
        self.ttft_count = 0
        self.finished: Counter = Counter()  # finish reason -> requests
        self.rejected = 0  # 429s
        self.dropped = 0  # queued requests whose client went away
        self.queue_depth = 0
        self.running = 0

    def request(self, route: str, status: int) -> None:
        with self.lock:
            self.requests[(route, status)] += 1

    def first_token(self, seconds: float) -> None:
        with self.lock:
            i = next((i for i, b in enumerate(TTFT_BUCKETS) if seconds <= b), len(TTFT_BUCKETS))
            self.ttft[i] += 1
            self.ttft_sum += seconds
            self.ttft_count += 1

    def step(self, drafted: int, accepted: int, emitted: int, prefill: bool) -> None:
        with self.lock:
            self.generation_tokens += emitted
            if prefill:
                return
            self.acceptance[accepted + 1] += 1
            if drafted:
                self.drafts += 1
                self.draft_tokens += drafted
                self.accepted_tokens += accepted

    def finish(self, reason: str, prompt_tokens: int) -> None:
        with self.lock:
            self.finished[reason] += 1
            self.prompt_tokens += prompt_tokens

    def render(self) -> str:
        label = f'model_name="{self.model}"'
        out: list[str] = []

        def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
            out.append(f"# HELP dflash:{name} {help_}")
            out.append(f"# TYPE dflash:{name} {kind}")
            for sample, value in samples:
                sample = sample if "{" in sample else f"{sample}{{{label}}}"
                out.append(f"dflash:{sample} {value:g}")

        with self.lock:
            metric("requests_total", "counter", "HTTP requests by route and status.",
                   [(f'requests_total{{{label},route="{r}",status="{s}"}}', n) for (r, s), n in sorted(self.requests.items())])
            metric("request_finished_total", "counter", "Generations by finish reason.",
                   [(f'request_finished_total{{{label},finish_reason="{k}"}}', n) for k, n in sorted(self.finished.items())])
            metric("prompt_tokens_total", "counter", "Prompt tokens of finished generations.",
                   [("prompt_tokens_total", self.prompt_tokens)])
            metric("generation_tokens_total", "counter", "Generated tokens.", [("generation_tokens_total", self.generation_tokens)])
            metric("spec_decode_num_drafts_total", "counter", "Verify steps (one drafted block each).",
                   [("spec_decode_num_drafts_total", self.drafts)])
            metric("spec_decode_num_draft_tokens_total", "counter", "Drafted tokens.",
                   [("spec_decode_num_draft_tokens_total", self.draft_tokens)])
            metric("spec_decode_num_accepted_tokens_total", "counter", "Drafted tokens the target kept.",
                   [("spec_decode_num_accepted_tokens_total", self.accepted_tokens)])
            steps = sum(self.acceptance.values())
            cumulative, samples = 0, []
            for n in range(1, max([self.block_size, *self.acceptance]) + 1):
                cumulative += self.acceptance.get(n, 0)
                samples.append((f'acceptance_length_bucket{{{label},le="{n}"}}', cumulative))
            samples += [(f'acceptance_length_bucket{{{label},le="+Inf"}}', steps),
                        (f"acceptance_length_sum{{{label}}}", sum(n * c for n, c in self.acceptance.items())),
                        (f"acceptance_length_count{{{label}}}", steps)]
            metric("acceptance_length", "histogram", "Tokens committed per verify step (tau is its mean).", samples)
            cumulative, samples = 0, []
            for bound, count in zip(TTFT_BUCKETS, self.ttft):
                cumulative += count
                samples.append((f'time_to_first_token_seconds_bucket{{{label},le="{bound}"}}', cumulative))
            samples += [(f'time_to_first_token_seconds_bucket{{{label},le="+Inf"}}', self.ttft_count),
                        (f"time_to_first_token_seconds_sum{{{label}}}", self.ttft_sum),
                        (f"time_to_first_token_seconds_count{{{label}}}", self.ttft_count)]
            metric("time_to_first_token_seconds", "histogram", "Time from arrival to the first token.", samples)
            metric("num_requests_waiting", "gauge", "Requests in the queue.", [("num_requests_waiting", self.queue_depth)])
            metric("num_requests_running", "gauge", "Requests on the engine (0 or 1).", [("num_requests_running", self.running)])
            metric("requests_rejected_total", "counter", "Requests refused with 429 (queue full).",
                   [("requests_rejected_total", self.rejected)])
            metric("requests_dropped_total", "counter", "Queued requests whose client went away.",
                   [("requests_dropped_total", self.dropped)])
        return "\n".join(out) + "\n"
