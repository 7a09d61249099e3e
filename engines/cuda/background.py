"""Decode steps compiled in a thread while the engine is idle, so a chat never waits for inductor.

The CPU's fast path (graphs.py, mode "inductor") compiles 10 to 20 step functions: 30 to 100 s cold on two
cores, about 17 s from inductor's disk cache. Compiled at load, that is time to the first token. Here the
compile starts after the first answer instead, on caches of its own (a CachePool apart from the one the
eager requests use), one step function at a time; a request that arrives meanwhile waits for at most the
function being compiled, then runs eager while the compile waits. The next request after the last function
adopts the compiled steps and their caches (the turns kept in the eager caches are dropped: one full
prefill).

`ModelGate` serialises the two threads' use of the model: a request, a probe or a baseline holds it for
its whole length, the compile for one function; a waiting request always goes first.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator, Optional

from dflash_tui.engines.cuda.cache import CachePool
from dflash_tui.engines.cuda.graphs import StepGraphs, capture_for_request


class CompileStopped(Exception):
    """The engine closed while its steps compiled in the background."""


class ModelGate:
    """One user of the model at a time: requests (`use`) before the compile's functions (`compile_turn`).
    Re-entrant per thread, so a request's own nested calls pass."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._owner: Optional[int] = None
        self._depth = 0
        self._waiting = 0  # requests waiting for the model
        self.closing = False  # the engine closes: the compile takes no further turn

    @contextmanager
    def _hold(self, request: bool) -> Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._depth += 1
            else:
                self._waiting += request
                while self._owner is not None or (not request and self._waiting):
                    self._cond.wait()
                if not request and self.closing:
                    self._cond.notify_all()
                    raise CompileStopped("the engine closed")
                self._waiting -= request
                self._owner, self._depth = me, 1
        try:
            yield
        finally:
            with self._cond:
                self._depth -= 1
                if not self._depth:
                    self._owner = None
                    self._cond.notify_all()

    def use(self):
        """Held by a request for as long as it touches the model."""
        return self._hold(True)

    def compile_turn(self):
        """Held by the compile for one step function, only while no request waits."""
        return self._hold(False)


class BackgroundSteps:
    """The compile thread and what it produced: `graphs` and their `pool`, usable once `wait` says it ended `ok`."""

    def __init__(self, target, draft, gate: ModelGate, block_size: int, max_new_tokens: int,
                 window: Optional[int]) -> None:
        self.gate = gate
        self.graphs = StepGraphs(target, draft, "inductor", gate=gate.compile_turn)
        self.pool = CachePool(target, draft)
        self._args = (block_size, max_new_tokens, window)
        self._thread: Optional[threading.Thread] = None
        self._done = threading.Event()
        self.ok = False
        self.seconds = 0.0

    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        def run() -> None:
            started = time.perf_counter()
            try:
                self.ok = capture_for_request(self.graphs, self.pool, *self._args)
            except Exception as exc:  # never reaches a request: eager it stays, and says why
                self.graphs.failed = self.graphs.failed or f"compile failed ({type(exc).__name__}: {exc})"
            self.seconds = time.perf_counter() - started
            self._done.set()

        self._thread = threading.Thread(target=run, name="dflash-compile", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """No further function is compiled; returns once the one being compiled (if any) is done."""
        self.gate.closing = True
        if self.started:
            with self.gate.use():
                pass

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Whether the compile has ended (well or not) within `timeout` seconds."""
        return self._done.wait(timeout)
