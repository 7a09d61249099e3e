"""Starting `dflash serve`: the host check (a key beyond loopback), the engine process, uvicorn."""

from __future__ import annotations

import asyncio
import inspect
import ipaddress
import os
import signal
import socket
import sys
import threading
import time
from typing import Any, Optional

from dflash_tui.core.terminal import color_enabled
from dflash_tui.engines.engine import EngineLike
from dflash_tui.engines.errors import UserError

from .app import MAX_BODY, ServeState, build_app
from .metrics import Metrics
from .worker import EngineWorker


class Terminated(Exception):
    """SIGTERM arrived (after uvicorn's graceful shutdown)."""


def _terminated(signum, frame) -> None:
    raise Terminated()


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and names that resolve only to those."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    # an address that is no IP text (an IPv6 one where Python was built without IPv6) counts as not loopback
    return bool(addresses) and all(isinstance(a, str) and ipaddress.ip_address(a.split("%")[0]).is_loopback
                                   for a in addresses)


def check_host(host: str, api_key: Optional[str]) -> None:
    if not api_key and not is_loopback(host):
        raise UserError(f"Serving on {host} reaches beyond this machine, so it needs an API key: pass --api-key KEY "
                        "(or set DFLASH_API_KEY), or serve on 127.0.0.1.")


def check_port(host: str, port: int) -> None:
    """Refuse a port another server holds before the weights load (uvicorn binds only after)."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host.strip("[]"), port))
        except OSError as exc:
            raise UserError(f"Port {port} on {host} cannot be used ({exc.strerror or exc}); pick another with --port.") \
                from None


SHUTDOWN_GRACE_S = 3.0  # --shutdown-grace: how long running answers may go on after SIGTERM


STOP_SLACK_S = 0.9  # after the grace: the longest the stop itself may take (the promise is grace + 1 s)
SETTLE_S = 0.5  # of which uvicorn's wait for the answers that were cut at the grace to send their last chunk


def exit_now() -> None:
    """Exit at once, once the server has stopped and its engine process is gone: a normal interpreter exit
    tears down torch and the tokenizer for a second or more, which would break the promise that SIGTERM
    ends the server within --shutdown-grace plus one second."""
    try:  # what multiprocessing's atexit hook does: its semaphores unlinked, not reported as leaked
        from multiprocessing import util

        util._exit_function()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - leaving anyway
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    os._exit(0)


def _leave(engine: EngineLike) -> None:
    """The backstop when stopping overruns grace + STOP_SLACK_S (an engine step that does not end, a client
    that does not read): the engine process is killed and this process exits at once."""
    engine.kill()
    exit_now()


def draining_server(uvicorn, config, state: ServeState, grace: float):
    """uvicorn's server, told about SIGTERM first: the worker stops taking requests and fails the queued
    ones (503), the running answer may go on for `grace` seconds and then ends with an error chunk and
    [DONE]; uvicorn waits SETTLE_S more for those last chunks. The process is gone within grace +
    STOP_SLACK_S whatever happens: a timer started with the signal ends it if the stop has not."""

    class DrainingServer(uvicorn.Server):
        stop_by: Optional[float] = None  # time.monotonic() by which the stop must be done

        def handle_exit(self, sig, frame) -> None:
            if not self.should_exit:
                self.stop_by = time.monotonic() + grace + STOP_SLACK_S
                backstop = threading.Timer(grace + STOP_SLACK_S, _leave, (state.engine,))
                backstop.daemon = True
                backstop.start()
                try:
                    loop = asyncio.get_running_loop()
                except RuntimeError:
                    loop = None
                state.worker.drain()
                if loop is not None:
                    loop.call_later(grace, state.worker.abort_running)
                else:
                    state.worker.abort_running()
            super().handle_exit(sig, frame)

    return DrainingServer(config)


def serve(config, names: list[str], defaults: dict, host: str = "127.0.0.1", port: int = 8000,
          api_key: Optional[str] = None, max_queue: int = 64, reasoning_split: bool = True,
          in_process: bool = False, say=lambda text: print(text, file=sys.stderr, flush=True),
          max_body: int = MAX_BODY, clamp_max_tokens: bool = False, allowed_origins: tuple = (),
          shutdown_grace: float = SHUTDOWN_GRACE_S, prefix_reuse: bool = True, allowed_hosts: tuple = ()) -> None:
    """Load the engine (in the engine process unless `in_process`), then serve until interrupted."""
    check_host(host, api_key)
    check_port(host, port)
    import uvicorn

    if in_process:
        from dflash_tui.engines import load_engine

        engine = load_engine(config)
    else:
        from dflash_tui.engines.process import ProcessEngine

        engine = ProcessEngine(config)
    metrics = Metrics(names[0], engine.block_size or 1)
    worker = EngineWorker(engine, max_queue=max_queue, metrics=metrics)
    state = ServeState(engine=engine, worker=worker, metrics=metrics, names=names, defaults=defaults,
                       reasoning_split=reasoning_split, api_key=api_key, max_body=max_body,
                       clamp_max_tokens=clamp_max_tokens, allowed_origins=tuple(allowed_origins),
                       prefix_reuse=prefix_reuse, host=host, allowed_hosts=tuple(allowed_hosts))
    app = build_app(state)
    for warning in engine.warnings:
        say(f"note: {warning}")
    shown = f"[{host}]" if ":" in host else host
    say(f"dflash serve: {names[0]} on the {engine.name} engine ({engine.device}, {engine.dtype}, block "
        f"{engine.block_size}) at http://{shown}:{port}/v1" + (" · API key required" if api_key else "")
        + " · ctrl+c stops")
    # where the checkpoints are on this disk: in the server's own log only (/v1/models names them)
    say(f"checkpoints: target {engine.target_info.path}" +
        (f", draft {engine.draft_info.path}" if engine.draft_info is not None else ""))
    server = draining_server(uvicorn, uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off",
                                                     timeout_graceful_shutdown=shutdown_grace + SETTLE_S,  # type: ignore[arg-type]
                                                     access_log=False,
                                                     use_colors=color_enabled(sys.stderr)),
                             state, shutdown_grace)
    # uvicorn shuts down gracefully on SIGTERM, then re-raises the signal: turned into an exception here,
    # it lets the cleanup below stop the engine process instead of the process dying mid-way
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        server.run()
    except Terminated:
        pass
    except SystemExit:
        raise UserError(f"Port {port} on {host} cannot be used (another server may hold it); pick another with --port.") \
            from None
    finally:
        left = STOP_SLACK_S if server.stop_by is None else max(0.05, server.stop_by - time.monotonic())
        worker.close(left)
        close: Any = engine.close
        if "timeout" in inspect.signature(close).parameters:  # the engine process: bounded by what is left
            close(timeout=max(0.05, server.stop_by - time.monotonic()) if server.stop_by is not None else 2.0)
        else:
            close()
        signal.signal(signal.SIGTERM, previous)
    if not server.started:
        raise UserError(f"Port {port} on {host} cannot be used (another server may hold it); pick another with --port.")
