"""Prometheus metrics for `dflash serve`: counted here, written by prometheus_client (text format 0.0.4).

Names follow vLLM's where one exists (`..._time_to_first_token_seconds`, spec-decode counters as
drafts / draft tokens / accepted tokens), with the `dflash:` prefix.
"""

from __future__ import annotations

import threading
from collections import Counter

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

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
        self.preparing = 0  # requests whose JSON, chat template or tokenization is being worked on

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
        """The metrics in Prometheus' text format, written by prometheus_client (labels escaped)."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(self))
        return generate_latest(registry).decode()

    def families(self):
        """Prometheus metric families of the current values (under the lock)."""
        model = [self.model]
        with self.lock:
            requests = CounterMetricFamily("dflash:requests", "HTTP requests by route and status.",
                                           labels=["model_name", "route", "status"])
            for (route, status), n in sorted(self.requests.items()):
                requests.add_metric([self.model, route, str(status)], n)
            finished = CounterMetricFamily("dflash:request_finished", "Generations by finish reason.",
                                           labels=["model_name", "finish_reason"])
            for reason, n in sorted(self.finished.items()):
                finished.add_metric([self.model, reason], n)
            out = [requests, finished]
            for name, help_, value in (
                    ("prompt_tokens", "Prompt tokens of finished generations.", self.prompt_tokens),
                    ("generation_tokens", "Generated tokens.", self.generation_tokens),
                    ("spec_decode_num_drafts", "Verify steps (one drafted block each).", self.drafts),
                    ("spec_decode_num_draft_tokens", "Drafted tokens.", self.draft_tokens),
                    ("spec_decode_num_accepted_tokens", "Drafted tokens the target kept.", self.accepted_tokens),
                    ("requests_rejected", "Requests refused with 429 (queue full).", self.rejected),
                    ("requests_dropped", "Queued requests whose client went away.", self.dropped)):
                family = CounterMetricFamily(f"dflash:{name}", help_, labels=["model_name"])
                family.add_metric(model, value)
                out.append(family)
            steps, cumulative, buckets = sum(self.acceptance.values()), 0, []
            for n in range(1, max([self.block_size, *self.acceptance]) + 1):
                cumulative += self.acceptance.get(n, 0)
                buckets.append((str(n), cumulative))
            acceptance = HistogramMetricFamily("dflash:acceptance_length",
                                               "Tokens committed per verify step (tau is its mean).", labels=["model_name"])
            acceptance.add_metric(model, buckets + [("+Inf", steps)], sum(n * c for n, c in self.acceptance.items()))
            cumulative, buckets = 0, []
            for bound, count in zip(TTFT_BUCKETS, self.ttft):
                cumulative += count
                buckets.append((str(bound), cumulative))
            ttft = HistogramMetricFamily("dflash:time_to_first_token_seconds", "Time from arrival to the first token.",
                                         labels=["model_name"])
            ttft.add_metric(model, buckets + [("+Inf", self.ttft_count)], self.ttft_sum)
            out += [acceptance, ttft]
            for name, help_, value in (("num_requests_waiting", "Requests in the queue.", self.queue_depth),
                                       ("num_requests_running", "Requests on the engine (0 or 1).", self.running),
                                       ("num_requests_preparing", "Requests being parsed and tokenized.",
                                        self.preparing)):
                family = GaugeMetricFamily(f"dflash:{name}", help_, labels=["model_name"])
                family.add_metric(model, value)
                out.append(family)
        return out


class _Collector:
    """Hands prometheus_client the families of one Metrics."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def collect(self):
        return self.metrics.families()
