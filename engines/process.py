"""An engine in a child process, so decoding never shares the interpreter lock with the UI.

A Textual frame costs tens of milliseconds of Python; on the same interpreter as a decode thread that
time comes straight out of the engine's tokens/s (measured: a tiny pair kept a third of its rate). The
TUI therefore runs the engine in a spawned process: requests go down a pipe, `StepEvent`s and the
`Summary` come back. The parent keeps only the tokenizer (for prompt ids, context trimming and the
session header). Cancelling sets a process-shared event the engine checks between steps, so escape
still stops within one step. Anything the child raises comes back as the same kind of error. The
baselines (`top2_margin`, `baseline_generate`) are answered by the child too, so `ProcessEngine` is
an `EngineLike` (engines/engine.py) like any other.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing as mp
import os
import sys
import threading
import time
from dataclasses import fields
from typing import Generator, Iterator, Optional

from dflash_tui.engines import reasoning
from dflash_tui.engines.baseline import BaselineRun, Margin
from dflash_tui.engines.config import BACKGROUND, EngineConfig, GenerationRequest
from dflash_tui.engines.engine import Progress
from dflash_tui.engines.errors import CheckpointError, EngineUnavailable, UserError
from dflash_tui.engines.events import StepEvent, Summary
from dflash_tui.engines.probe import Block1Probe
from dflash_tui.engines.prompting import load_tokenizer, prompt_ids

ERRORS = {"UserError": UserError, "CheckpointError": CheckpointError, "EngineUnavailable": EngineUnavailable}
BATCH_S = 0.05  # events travel in batches: one wake-up of the UI process per 50 ms, not one per step
REQUEST_FIELDS = [f.name for f in fields(GenerationRequest) if f.name != "cancel"]
# engine methods the child answers with one value
CALLS = ("top2_margin", "baseline_generate", "new_context", "measure_block1", "prepare_steps")


def _error(exc: BaseException) -> tuple:
    if isinstance(exc, UserError):
        return ("error", type(exc).__name__ if type(exc).__name__ in ERRORS else "UserError", str(exc))
    return ("error", "Exception", f"{type(exc).__name__}: {exc}")


def quiet_loaders() -> None:
    """Progress bars from transformers / huggingface_hub would write over the screen."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    except Exception:  # noqa: BLE001 - a best-effort probe
        pass


def _leave_a_core_for_the_ui() -> None:
    """On the CPU the engine's intra-op threads would otherwise contend with the UI process for every
    core, and spinning threads that lose their core slow each step far more than one core less does."""
    cores = os.cpu_count() or 1
    if cores > 1 and "OMP_NUM_THREADS" not in os.environ:
        try:
            import torch

            torch.set_num_threads(cores - 1)
        except ImportError:
            pass


PARENT_POLL_S = 0.1  # how often the child looks for its parent where the kernel cannot tell it


def die_with_parent(parent: int, kernel_signal: bool) -> None:
    """End this process as soon as `parent` (the process that started it) is gone, even SIGKILLed, instead
    of computing an answer nobody reads. On Linux the kernel sends SIGKILL when the parent dies
    (PR_SET_PDEATHSIG) where the parent started us from its main thread (the signal follows the starting
    thread, and a UI's loader thread ends long before the app); everywhere a daemon thread also watches the
    parent id, which changes when the parent is gone."""
    if kernel_signal and sys.platform.startswith("linux"):
        try:
            import ctypes
            import signal

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # gone before the signal was armed
        os._exit(0)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(0)

    threading.Thread(target=watch, name="dflash-parent-watch", daemon=True).start()


def _serve(config: EngineConfig, conn, cancel, parent: Optional[int] = None, kernel_signal: bool = False) -> None:
    """The child: load the engine, then answer generate requests until told to close (or orphaned); then
    leave at once. Everything it sent is in the pipe already, and a normal interpreter exit (the frameworks'
    thread pools and finalizers) took seconds, which the parent's shutdown would wait for."""
    if parent is not None:
        die_with_parent(parent, kernel_signal)
    try:
        _answer(config, conn, cancel)
    finally:
        os._exit(0)


def _answer(config: EngineConfig, conn, cancel) -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)  # never write over the parent's screen
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    quiet_loaders()
    from dflash_tui.engines import load_engine

    _leave_a_core_for_the_ui()
    if config.compile_steps is None and "DFLASH_COMPILE" not in os.environ:
        # a chat or a server lives long: on the CPU its decode steps compile in the background after the first
        # answer (engines/cuda/background.py); elsewhere this asks nothing
        config = dataclasses.replace(config, compile_steps=BACKGROUND)
    try:
        engine = load_engine(config, progress=lambda stage: conn.send(("progress", stage)))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        conn.send(_error(exc))
        return
    info = {"name": engine.name, "device": engine.device, "dtype": engine.dtype, "block_size": engine.block_size,
            "warnings": list(engine.warnings), "target_info": engine.target_info, "draft_info": engine.draft_info,
            "baseline_name": engine.baseline_name}
    conn.send(("ready", info))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return  # the parent is gone
        if message[0] == "call" and message[1] in CALLS:
            try:
                conn.send(("result", getattr(engine, message[1])(*message[2])))
            except BaseException as exc:  # noqa: BLE001 - sent to the parent as the request's error
                conn.send(_error(exc))
            continue
        if message[0] != "generate":
            return
        request = GenerationRequest(**message[1])
        request.cancel = cancel
        try:
            batch, sent = [], time.perf_counter()
            for event in engine.generate(request):
                batch.append(event)
                now = time.perf_counter()
                if now - sent >= BATCH_S or event.is_prefill:
                    conn.send(("events", batch))
                    batch, sent = [], now
            if batch:
                conn.send(("events", batch))
            conn.send(("summary", engine.last_summary))
        except (BrokenPipeError, EOFError, OSError):
            return
        except BaseException as exc:  # noqa: BLE001 - sent to the parent as a load error
            conn.send(_error(exc))


@contextlib.contextmanager
def _real_stdio():
    """The real stdio in place while multiprocessing starts helpers: an app that captures sys.stderr
    (Textual does) would hand it a stream with no usable file descriptor."""
    saved = sys.stdout, sys.stderr
    if sys.__stdout__ is not None and sys.__stderr__ is not None:
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


class ProcessEngine:
    """An `EngineLike` served by a child process. Construction blocks until the child has loaded (or
    failed). `progress` hears the child's stages (loading, capturing CUDA graphs) whenever they run: during
    the load, and later in prepare_steps or a request that needs a capture."""

    reports_steps = True  # the child's events are its engine's verify steps

    def __init__(self, config: EngineConfig, progress: Optional[Progress] = None):
        self.config = config
        self.progress = progress
        ctx = mp.get_context("spawn")
        with _real_stdio():
            self._cancel = ctx.Event()
            self._conn, child = ctx.Pipe()
            on_main_thread = threading.current_thread() is threading.main_thread()
            self._proc = ctx.Process(target=_serve, args=(config, child, self._cancel, os.getpid(), on_main_thread),
                                     daemon=True, name="dflash-engine")
            self._proc.start()
        child.close()
        try:
            message = self._next()
        except EOFError:
            self._proc.join(5)
            raise UserError(f"The engine process exited while loading (exit code {self._proc.exitcode}); "
                            "run `dflash generate` with the same profile to see the error.") from None
        if message[0] == "error":
            self.close()
            self._raise(message)
        info = message[1]
        self.name, self.device, self.dtype = info["name"], info["device"], info["dtype"]
        self.block_size, self.warnings = info["block_size"], info["warnings"]
        self.target_info, self.draft_info = info["target_info"], info["draft_info"]
        self.baseline_name = info["baseline_name"]
        self.generation_config = self.target_info.generation_config()
        self.tokenizer = load_tokenizer(self.target_info.path)
        self.last_summary: Optional[Summary] = None

    @property
    def trained_block_size(self) -> Optional[int]:
        return self.draft_info.block_size if self.draft_info else None

    @staticmethod
    def _raise(message: tuple) -> None:
        _, kind, text = message
        raise ERRORS.get(kind, RuntimeError)(text)

    def decode(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def stop_ids(self) -> list[int]:
        return reasoning.stop_ids(self.tokenizer, self.target_info.stop_ids())

    def prepare(self, request: GenerationRequest) -> list[int]:
        return prompt_ids(self.tokenizer, request)

    def _call(self, method: str, *args):
        self._conn.send(("call", method, args))
        message = self._recv()
        if message[0] == "error":
            self._raise(message)
        return message[1]

    def top2_margin(self, ids: list[int]) -> Margin:
        return self._call("top2_margin", list(ids))

    def new_context(self) -> None:
        """Forget the caches the child kept from earlier requests (Engine.new_context)."""
        self._call("new_context")

    def baseline_generate(self, prompt_ids: list[int], max_new_tokens: int, temperature: float) -> BaselineRun:
        return self._call("baseline_generate", list(prompt_ids), max_new_tokens, temperature)

    def prepare_steps(self, block_size: int) -> bool:
        """The child's Engine.prepare_steps (its graph captures, between requests)."""
        return self._call("prepare_steps", block_size)

    def measure_block1(self, steps: int = 4) -> Optional[Block1Probe]:
        """The child's probe over the caches it keeps (Engine.measure_block1). Like every call it shares
        the pipe with generations: a front end makes them one at a time (the probe lasts steps + 1 block-1 steps)."""
        return self._call("measure_block1", steps)

    def generate(self, request: GenerationRequest) -> Iterator[StepEvent]:
        self.last_summary = None
        self._cancel.clear()
        if request.cancel.is_set():
            self._cancel.set()
        original = request.cancel
        request.cancel = self._cancel  # setting the request's cancel now reaches the child at once
        self._conn.send(("generate", {name: getattr(request, name) for name in REQUEST_FIELDS}))
        return self._events(original)

    def _events(self, original) -> Generator[StepEvent, None, None]:
        done = False
        try:
            while True:
                if original.is_set() and not self._cancel.is_set():  # someone kept the old event
                    self._cancel.set()
                message = self._recv()
                if message[0] == "events":
                    yield from message[1]
                elif message[0] == "summary":
                    self.last_summary = message[1]
                    done = True
                    return
                else:
                    done = True
                    self._raise(message)
        finally:
            if not done:  # the consumer stopped early: stop the child and drain to the end of this turn
                self._cancel.set()
                while True:
                    try:
                        message = self._recv()
                    except UserError:
                        break
                    if message[0] == "summary":
                        self.last_summary = message[1]
                        break
                    if message[0] == "error":
                        break

    def _next(self):
        """The child's next message other than a progress stage (those go to `progress` as they come)."""
        while True:
            message = self._conn.recv()
            if message[0] != "progress":
                return message
            if self.progress is not None:
                self.progress(message[1])

    def _recv(self):
        try:
            return self._next()
        except (EOFError, OSError):
            self._proc.join(1)
            raise UserError(f"The engine process stopped (exit code {self._proc.exitcode}); reload it from the "
                            "command palette (ctrl+p, Engine: ...) or restart dflash chat.") from None

    def close(self, timeout: float = 2.0) -> None:
        """Ask the child to stop; after `timeout` seconds it is terminated, and killed if that is not enough."""
        try:
            self._conn.send(("close",))
        except (OSError, ValueError):
            pass
        self._proc.join(timeout)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(min(timeout, 2.0))
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(1)
        self._conn.close()

    def kill(self) -> None:
        """Stop the child at once (SIGKILL): for a parent that must exit now."""
        try:
            self._proc.kill()
        except (AttributeError, OSError, ValueError):
            pass

    def __del__(self):
        try:
            if self._proc.is_alive():
                self.close()
        except Exception:  # noqa: BLE001 - a child that is gone already
            pass
