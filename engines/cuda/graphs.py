"""CUDA graphs of the decode step: the draft's block pass, the verify pass per block size (which also
writes the draft's context K/V for the block), and the block-1 step.

Enabled by `EngineConfig.cuda_graphs` (or `DFLASH_CUDA_GRAPHS=1` when that is left unset). A replayed graph
runs no Python, so everything a step depends on lives in static device buffers the host fills with
device-side copies before replaying (the last token, the block positions): no host sync is added, the
step keeps its one sync. Context features are explicit outputs of the captured verify (transformers'
hidden_states), never hooks. Attention reads the caches up to the step's tier under a mask (cache.py):
one graph set per (block size, tier), so a step attends over at most one tier more than the live context.
A new bucket, block size or tier means new captures, made before the prefill of the request that needs
them (at load for the profile's request), never while a step runs. A shrunk last block is padded to the
captured size.

On the CPU the same step functions are compiled by inductor instead (`EngineConfig.compile_steps`, or
`DFLASH_COMPILE=1`): C++ kernels with fused elementwise work and no module dispatch per op, one compiled
function per (kind, block size, tier), cached on disk by inductor between runs (`inductor_cache`).

Where capture is impossible the engine runs eager and says why (`why_eager`): CUDA graphs off a GPU, hybrid
(gated-delta) targets whose conv states transformers reassigns and whose rollback re-runs mixers, MoE
routing (data-dependent expert dispatch syncs with the host), a target spread over several GPUs, and
attention layers that are neither full attention nor sliding windows (the static step's mask is windowed per
layer type, so sliding layers are captured: Gemma 4's dense targets).

`mode` says how a step function is captured: "cuda" (CUDA graphs), "inductor" (torch.compile with fullgraph and
inductor, the CPU's fast path), "trace" (the CPU stand-in for CUDA graphs: the same
two warm-up passes over the live caches, then the function traced once with make_fx and the trace
replayed from then on, so a per-step Python value frozen into a step shows as wrong ids on the CPU, as it
would on a GPU), "compile" (a CPU proof: torch.compile with fullgraph on a counting eager backend, so a
graph break raises and a per-step value shows as a recompile), or "off" (the static functions run
eagerly, built once).
"""

from __future__ import annotations

import os
import time
import types
from contextlib import nullcontext
from typing import Callable, ContextManager, Optional

import torch
from transformers.cache_utils import DynamicLayer

from dflash_tui.engines.cuda.cache import TIER, bucket_layers, tier
from dflash_tui.engines.cuda.draft import Proposal


def why_eager(target, device: torch.device, mode: str = "cuda") -> Optional[str]:
    """None when the step can be captured in `mode` on this target and device, else the reason it cannot."""
    if mode == "cuda" and device.type != "cuda":
        return "CUDA graphs need a CUDA device"
    if target.rollback:
        return "hybrid (gated-delta) target: conv states are reassigned and rollback re-runs the mixers"
    config = target.model.config.get_text_config(decoder=True)
    if "moe" in config.model_type or getattr(config, "num_experts", None):
        return "MoE routing dispatches experts with host syncs"
    devices = set(getattr(target.model, "hf_device_map", {}).values())
    if len(devices) > 1:
        return "the target is spread over several GPUs"
    if any(t not in ("full_attention", "sliding_attention") for t in getattr(config, "layer_types", None) or []):
        return "attention layers other than full attention and sliding windows"
    return None


def inductor_cache() -> None:
    """Keep inductor's compiled steps in dflash's cache folder (platformdirs), not under /tmp where a reboot loses
    them and a second start would compile again; a TORCHINDUCTOR_CACHE_DIR of the user's wins. (Importing
    torch._inductor sets the variable to its /tmp default, so that value counts as unset.)"""
    import platformdirs
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    if os.environ.get("TORCHINDUCTOR_CACHE_DIR") in (None, default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(platformdirs.user_cache_dir("dflash"), "inductor")


MODES = ("cuda", "inductor", "trace", "compile", "off")

PROMPT_ROOM = 1008  # prompt tokens the load-time captures make room for (with the profile's max_new_tokens)


def own_code(fn: Callable, name: str) -> Callable:
    """`fn` with a code object of its own: dynamo keeps its compiled entries per code object, and every
    step function of a kind shares one, so each (block, tier) would add an entry that every call looks
    through; with its own code a step function has exactly one."""
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{name}")
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)


class StepGraphs:
    """Static buffers and captured graphs for one set of pooled caches (one bucket)."""

    def __init__(self, target, draft, mode: str = "cuda", gate: Optional[Callable[[], ContextManager]] = None):
        if mode not in MODES:
            raise ValueError(f"mode {mode!r} is not one of {MODES}")
        self.target, self.draft, self.mode = target, draft, mode
        self.cache = self.draft_cache = None
        self.graphs: dict[tuple[str, int, int], Callable[[], torch.Tensor]] = {}  # (kind, block, reach)
        self.captures = 0  # step functions captured (or, with mode "off", built) so far, failed ones included
        self.replays = 0  # captured steps replayed (verify passes; mode "off": static functions run)
        self.compiles = 0  # mode "compile": graphs dynamo handed to the backend (one per step function)
        self.capture_s = 0.0
        self.failed: Optional[str] = None  # why a capture failed; the engine then stays eager
        self._buffers: Optional[tuple[int, ...]] = None  # the data pointers the graphs were captured on
        self._draft_buffers: Optional[tuple[int, ...]] = None
        self._pool: Optional[torch.cuda._POOL_HANDLE] = None
        self._static: dict[int, dict[str, torch.Tensor]] = {}
        self._capacity = self._reach = 0
        self._hooked = False  # mode "inductor": transformers' hidden-state hooks installed before any compile
        # held around each use of the model while capturing (background.py: a compile in a thread waits there
        # for the requests of the thread that decodes)
        self._gate = gate or nullcontext

    # -- set-up, between requests --------------------------------------------------------------
    def ready(self, cache, draft_cache, block_size: int, first: int = 0, room: int = 0,
              announce: Optional[Callable[[], None]] = None) -> Optional["StepGraphs"]:
        """Capture what `block_size` needs on these caches (before any prefill) for steps starting at
        `first` or later in a request of `room` positions: one graph set per tier of the attention reads
        those steps reach. None if a capture failed. `announce` is called once, before the first capture
        (not at all when everything is captured already)."""
        if self.failed:
            return None
        self.cache, self.draft_cache = cache, draft_cache
        with self._gate():
            self._allocate(cache, draft_cache)
        self._capacity = bucket_layers(cache)[0].capacity
        # a new bucket means new buffers: graphs that point at the old ones are dropped
        target_buffers = tuple(layer.k_buf.data_ptr() if layer.k_buf is not None else 0 for layer in bucket_layers(cache))
        if target_buffers != self._buffers:
            self.graphs.clear()
            self._buffers, self._draft_buffers = target_buffers, None
        if draft_cache is not None:
            draft_buffers = tuple(k.data_ptr() for k in draft_cache.k_bufs)
            if draft_buffers != self._draft_buffers:
                self.graphs = {key: g for key, g in self.graphs.items() if key[1] == 1}
                self._draft_buffers = draft_buffers
        started = time.perf_counter()
        try:
            with torch.inference_mode():
                for reach in self._reaches(first + block_size, max(room, first + block_size)):
                    missing = [kind for kind in ("draft", "verify") if (kind, block_size, reach) not in self.graphs
                               and (kind == "verify" or block_size > 1)]
                    if missing and announce is not None:
                        announce()
                        announce = None
                    for kind in missing:
                        fn = self._draft_fn if kind == "draft" else self._verify_fn
                        with self._gate():
                            self._build((kind, block_size, reach), fn(block_size, reach))
        except Exception as exc:  # capture impossible here: eager from now on, and said so
            self.failed = f"capture failed ({type(exc).__name__}: {exc})"
            self.graphs.clear()
            return None
        finally:
            self.capture_s += time.perf_counter() - started
        for layer in bucket_layers(cache):
            layer.length = 0
        return self

    def _allocate(self, cache, draft_cache) -> None:
        """Buffers exist before capture (allocating inside a capture would take graph-pool memory)."""
        if any(type(layer) is DynamicLayer for layer in cache.layers):
            raise ValueError("graph path needs bucket caches")
        if any(layer.k_buf is None for layer in bucket_layers(cache)):
            with torch.inference_mode():
                self.target.forward(torch.zeros(1, 1, dtype=torch.long, device=self.target.device), 0, cache,
                                    last_only=True, capture=False)
        if self.mode == "inductor" and not self._hooked:
            # transformers installs its hidden-state hooks on the first pass that asks for hidden states, and a
            # compiled step guards on each layer's hooks: a block-1 step compiled before them would never match again
            with torch.inference_mode():
                self.target.model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=self.target.device),
                                  use_cache=False, output_hidden_states=True)
            self._hooked = True
        if draft_cache is not None and draft_cache.k_bufs[0] is None:
            draft_cache.reserve(draft_cache.capacity, like=next(self.draft.parameters()))

    def _static_for(self, b: int) -> dict[str, torch.Tensor]:
        if b not in self._static:
            device = self.target.device
            mask_id = self.draft.mask_token_id if self.draft is not None else 0
            selector = self.draft.candidate_selector if self.draft is not None else None
            self._static[b] = {
                "arange": torch.arange(b, device=device),
                "positions": torch.arange(b, device=device),
                "block": torch.zeros(1, b, dtype=torch.long, device=device),
                "masks": torch.full((1, b - 1), mask_id, dtype=torch.long, device=device),
                # a DFlash 2 walk's inputs, filled before each replay (Sampler.walk_noise)
                "noise": torch.ones(max(b - 1, 1), selector.top_k if selector else 1, device=device),
                "temperature": torch.ones((), device=device),
            }
        return self._static[b]

    def _reaches(self, lo: int, hi: int) -> range:
        """The tiers steps whose blocks end between `lo` and `hi` positions read up to."""
        return range(tier(lo, self._capacity), tier(hi, self._capacity) + 1, TIER)

    def _draft_fn(self, b: int, reach: int) -> Callable:
        s = self._static_for(b)

        def draft_block():
            ids = torch.cat([s["block"][:, :1], s["masks"]], dim=1)
            hidden = self.draft_cache.static_hidden(self.draft.embed(self.target.embed, ids), s["positions"], reach)
            walk = (s["noise"], s["temperature"]) if self.draft.candidate_selector is not None else (None, None)
            proposal = self.draft.propose(hidden, s["block"][0, :1], self.target.lm_head, *walk)
            s["block"][0, 1:].copy_(proposal.ids)
            return s["block"], proposal.candidates, proposal.q  # tensors only: a traced graph returns no objects

        return draft_block

    def _verify_fn(self, b: int, reach: int) -> Callable:
        s = self._static_for(b)

        def verify():
            logits, features = self.target.static_forward(s["block"], s["positions"], self.cache, features=b > 1,
                                                          reach=reach)
            if b > 1:
                self.draft_cache.write_static(features, s["positions"])
            return logits

        return verify

    def _build(self, key: tuple[str, int, int], fn: Callable) -> None:
        """Capture `fn` as graphs[key] (kind, block size, reach). Every mode but "off" first runs it twice
        over the live caches (positions 0..b-1), so whatever they held is gone once this is called,
        whether or not the capture succeeds."""
        self.captures += 1
        if self.mode == "off":
            self.graphs[key] = fn
            return
        s = self._static_for(key[1])
        s["positions"].copy_(s["arange"])
        if self.mode == "inductor":
            for _ in range(2):
                fn()
            compiled = torch.compile(own_code(fn, "_".join(map(str, key))), fullgraph=True, dynamic=False,
                                     backend="inductor")
            compiled()  # compiled now (or read from inductor's cache), not in a step

            def run_compiled() -> torch.Tensor:
                # the function's one cache entry runs without its guards being checked: about 1 ms a call on
                # the demo (every parameter's identity and layout), a sixth of a step. Safe here: the step
                # reads the same buffers and shapes on every call, by construction (graphs.py docstring).
                # Global state a compiled step depends on (the thread count) is still checked: when it
                # changed, dynamo refuses to run the entry, and the guarded call compiles the step again
                try:
                    with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
                        return compiled()
                except RuntimeError as exc:
                    if "skip_guard_eval_unsafe" not in str(exc):
                        raise
                return compiled()

            self.graphs[key] = run_compiled
            return
        if self.mode in ("trace", "compile"):
            for _ in range(2):
                fn()
            if self.mode == "trace":
                from torch.fx.experimental.proxy_tensor import make_fx

                self.graphs[key] = make_fx(fn)()  # the buffers it reads and writes are baked in, as in a graph
                return
            compiled = torch.compile(fn, fullgraph=True, backend=self._compiled)  # a graph break raises
            compiled()
            self.graphs[key] = compiled
            return
        with torch.cuda.device(self.target.device):  # the capture stream on the target's own GPU
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):  # warm-up off the capture (lazy inits, cuBLAS workspaces)
                for _ in range(2):
                    fn()
            torch.cuda.current_stream().wait_stream(stream)
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                out = fn()

        def replay() -> torch.Tensor:
            graph.replay()
            return out

        self.graphs[key] = replay

    def _compiled(self, gm, example_inputs):
        """The compile mode's backend: counts what dynamo compiles, then runs it as traced."""
        self.compiles += 1
        return gm.forward

    # -- one step -----------------------------------------------------------------------------
    def reach(self, start: int, b: int) -> int:
        """How far a block of `b` at `start` reads the caches: the tier its last position falls in."""
        return tier(start + b, self._capacity)

    def covers(self, start: int, b: int) -> bool:
        """Whether a block of `b` at `start` has its captured step (else that step runs eager)."""
        return ("verify", b, self.reach(start, b)) in self.graphs

    def replayable(self, cache, b: int, start: int) -> bool:
        """Whether the verify step for block `b` at `start` runs on `cache` as it is: built for this very
        cache and its buffers (making one would run passes over them and lose what they keep)."""
        buffers = tuple(layer.k_buf.data_ptr() if layer.k_buf is not None else 0 for layer in bucket_layers(cache))
        return self.cache is cache and buffers == self._buffers and self.covers(start, b)

    def draft_step(self, last: torch.Tensor, start: int, b: int, sampler=None, live: Optional[int] = None
                   ) -> tuple[torch.Tensor, Optional[Proposal]]:
        """Fill the static inputs (device-side copies and draws, no sync) and run the draft: the block [1, b]
        and its Proposal (None at block 1). `live`: the positions that count in a shrunk last block run
        padded to b; the walk's noise is drawn for those only, as the eager loop draws it."""
        s = self._static[b]
        torch.add(s["arange"], start, out=s["positions"])
        s["block"][:, :1].copy_(last.view(1, 1))
        self._reach = self.reach(start, b)
        if b == 1:
            return s["block"], None
        if self.draft.candidate_selector is not None:
            slots = (live or b) - 1
            noise, temperature = sampler.walk_noise(slots, s["noise"].shape[1], s["noise"].device)
            s["noise"][:slots].copy_(noise)
            s["noise"][slots:].fill_(1.0)
            s["temperature"].copy_(temperature)
        block, candidates, q = self.graphs[("draft", b, self._reach)]()
        return block, Proposal(block[0, 1:], candidates, q)

    def verify_step(self, b: int) -> torch.Tensor:
        """Verify the block drafted last, in place: logits [1, b, vocab]; the draft's K/V are written."""
        self.replays += 1
        return self.graphs[("verify", b, self._reach)]()

    def commit(self, start: int, keep: int) -> None:
        """Keep the first `keep` block tokens in both caches: lengths move, nothing is copied."""
        for layer in bucket_layers(self.cache):
            layer.length = start + keep
        if self.draft_cache is not None:
            self.draft_cache.length = start + keep


def capture_for_request(graphs: StepGraphs, pool, block_size: int, max_new_tokens: int,
                        window: Optional[int] = None, progress: Optional[Callable[[str], None]] = None) -> bool:
    """Capture, on `pool`'s caches, what a request of up to PROMPT_ROOM prompt tokens and `max_new_tokens`
    new ones needs at `block_size` and at block 1 (the probe's step): the bucket the loop will ask for,
    so such a request captures nothing. False (with `graphs.failed` saying why) if a capture failed.
    `progress` hears each block size as its capture starts (none when all are captured already)."""
    blocks = sorted({1, block_size})
    room = PROMPT_ROOM + max_new_tokens + block_size  # the loop's room at the profile's block size
    for i, block in enumerate(blocks, 1):
        doing = "compiling the decode steps" if graphs.mode == "inductor" else "capturing CUDA graphs"
        said = f"{doing} for block {block} ({i} of {len(blocks)})"
        announce = None if progress is None else (lambda said=said: progress(said))
        cache = pool.target_cache(room)
        draft_cache = pool.draft_cache(window, room) if block > 1 else None
        if graphs.ready(cache, draft_cache, block, 0, room, announce) is None:
            return False
    return True
