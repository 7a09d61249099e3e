"""One engine, one request at a time: a bounded queue in front of a worker thread.

The engine runs in the engine process (engines/process.py), so this thread only moves events from the
pipe to the event loop. Requests wait in a FIFO with a bound; a full queue is refused at once (HTTP
429). A job whose client has gone is dropped from the queue, or, when it is running, cancelled: the
engine checks its cancel flag between steps, so it stops within one step.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from dflash_tui.engines.config import GenerationRequest

_ids = itertools.count(1)


class ShuttingDown(Exception):
    """The server is stopping (SIGTERM): a queued request is refused (503), a stream past the grace
    period ends with an error chunk."""

    def __init__(self, message: str = "The server is shutting down; retry on another replica or once it is back."):
        super().__init__(message)


class QueueFull(Exception):
    def __init__(self, retry_after: int):
        super().__init__("queue full")
        self.retry_after = retry_after


@dataclass
class Job:
    """A request for the engine and the asyncio queue its results go to: ("event", StepEvent),
    ("summary", Summary), ("error", exception); exactly one of the last two ends it."""

    request: GenerationRequest
    loop: asyncio.AbstractEventLoop
    results: asyncio.Queue = field(default_factory=asyncio.Queue)
    id: int = field(default_factory=lambda: next(_ids))
    gone: threading.Event = field(default_factory=threading.Event)
    queued_at: float = field(default_factory=time.perf_counter)
    started_at: Optional[float] = None
    state: str = "queued"  # queued, running, done, dropped

    def put(self, kind: str, value: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.results.put_nowait, (kind, value))
        except RuntimeError:  # the event loop has closed (server shutting down)
            pass


class EngineWorker:
    def __init__(self, engine, max_queue: int = 64, metrics=None):
        self.engine = engine
        self.max_queue = max_queue
        self.metrics = metrics
        self._pending: collections.deque[Job] = collections.deque()
        self._lock = threading.Condition()
        self._closed = False
        self.draining = False
        self.running: Optional[Job] = None
        self._durations: collections.deque[float] = collections.deque(maxlen=16)
        self._thread = threading.Thread(target=self._run, name="dflash-serve-worker", daemon=True)
        self._thread.start()

    # -- called from the event loop ------------------------------------------------------------
    def submit(self, job: Job) -> None:
        with self._lock:
            if self.draining or self._closed:
                raise ShuttingDown()
            if len(self._pending) >= self.max_queue:
                raise QueueFull(self.retry_after())
            self._pending.append(job)
            self._lock.notify()
        self._gauge()

    def cancel(self, job: Job) -> None:
        """The client has gone (or a stop string matched): drop the job or stop its generation."""
        job.gone.set()
        with self._lock:
            if job.state == "queued":
                try:
                    self._pending.remove(job)
                except ValueError:
                    pass
                job.state = "dropped"
                if self.metrics:
                    self.metrics.dropped += 1
            elif job.state == "running":
                job.request.cancel.set()  # after generate() this is the engine process's shared event
        self._gauge()

    @property
    def depth(self) -> int:
        return len(self._pending)

    def retry_after(self) -> int:
        """Seconds until a place frees up, estimated from recent request durations (at least 1)."""
        mean = sum(self._durations) / len(self._durations) if self._durations else 1.0
        return max(1, int(mean * max(1, len(self._pending) // 4) + 0.999))

    def drain(self) -> None:
        """SIGTERM: refuse new requests and fail the queued ones (503); the running one goes on."""
        with self._lock:
            self.draining = True
            for job in self._pending:
                job.state = "dropped"
                job.put("error", ShuttingDown())
            self._pending.clear()
        self._gauge()

    def abort_running(self) -> None:
        """The grace period is over: the running request ends with an error, and the engine stops
        within one step."""
        with self._lock:
            job = self.running
            if job is not None:
                job.put("error", ShuttingDown("The server is shutting down; this answer was cut off."))
                job.request.cancel.set()

    def close(self, timeout: float = 10.0) -> None:
        """Stop: queued jobs fail (503), the running one is cancelled; waits up to `timeout` s for the thread."""
        with self._lock:
            self._closed = True
            for job in self._pending:
                job.state = "dropped"
                job.put("error", ShuttingDown())
            self._pending.clear()
            if self.running is not None:
                self.running.request.cancel.set()
            self._lock.notify_all()
        self._thread.join(timeout)

    def _gauge(self) -> None:
        if self.metrics:
            self.metrics.queue_depth = len(self._pending)
            self.metrics.running = 1 if self.running is not None else 0

    # -- the worker thread --------------------------------------------------------------------------
    def _next(self) -> Optional[Job]:
        with self._lock:
            while not self._pending and not self._closed:
                self._lock.wait()
            if self._closed:
                return None
            job = self._pending.popleft()
            job.state = "running"
            job.started_at = time.perf_counter()
            self.running = job
        self._gauge()
        return job

    def _run(self) -> None:
        while True:
            job = self._next()
            if job is None:
                return
            try:
                if job.gone.is_set():
                    job.request.cancel.set()
                first = True
                for event in self.engine.generate(job.request):
                    job.put("event", event)
                    if self.metrics:
                        if first:
                            self.metrics.first_token(time.perf_counter() - job.queued_at)
                            first = False
                        self.metrics.step(len(event.drafted), event.accepted, len(event.emitted), event.is_prefill)
                    if job.gone.is_set():
                        job.request.cancel.set()
                summary = self.engine.last_summary
                if self.metrics and summary is not None:
                    self.metrics.finish(summary.finish_reason, summary.prompt_tokens)
                job.put("summary", summary)
            except BaseException as exc:  # noqa: BLE001 - handed to the request's handler
                job.put("error", exc)
            finally:
                with self._lock:
                    job.state = "done"
                    self.running = None
                self._durations.append(time.perf_counter() - (job.started_at or time.perf_counter()))
                self._gauge()
