"""Launch commands for vLLM and SGLang built from a profile's pair (`dflash profile serve-command`).

Both servers run DFlash drafts: vLLM through `--speculative-config` with method "dflash" and
`num_speculative_tokens` = block size - 1 (the drafted tokens per block), SGLang through
`--speculative-algorithm DFLASH` with `--speculative-num-draft-tokens` = the block size.
"""

from __future__ import annotations

import json
import shlex
from typing import Optional

from dflash_tui.engines.errors import UserError

DEFAULT_PORTS = {"vllm": 8000, "sglang": 30000}


def trained_block_size(draft: str) -> Optional[int]:
    """The draft's block size from its config.json, when it can be read without the network."""
    try:
        from dflash_tui.engines.checkpoints import DraftInfo

        return DraftInfo.read(draft).block_size
    except Exception:  # noqa: BLE001 - not cached, or not a draft: the caller says what it assumed
        return None


def serve_command(profile, server: str, host: str = "127.0.0.1", port: Optional[int] = None) -> tuple[str, list[str]]:
    """(the command line, notes) for `server` ('vllm' or 'sglang') serving the profile's pair."""
    p = profile.resolved("cuda")  # these servers run the GPU build of the pair
    if not p.draft:
        raise UserError(f"Profile {profile.name} has no draft; add draft = \"...\" under [model] to print a "
                        "speculative launch command.")
    target, draft = profile.local_path(p.target), profile.local_path(p.draft)
    notes: list[str] = []
    block = p.block_size or trained_block_size(draft)
    if block is None:
        block = 16
        notes.append("the draft's block size could not be read offline; 16 assumed (set block_size in [dflash])")
    port = DEFAULT_PORTS[server] if port is None else port
    qwen3 = "qwen3" in f"{p.target}".lower()
    gpt_oss = "gpt-oss" in f"{p.target}".lower()  # harmony: the servers' own reasoning and tool parsers
    if server == "vllm":
        spec = {"method": "dflash", "model": draft, "num_speculative_tokens": block - 1}
        args = ["vllm", "serve", target, "--speculative-config", json.dumps(spec)]
        if p.dtype != "auto":
            args += ["--dtype", p.dtype]
        if qwen3:
            args += ["--reasoning-parser", "qwen3"]
        if gpt_oss:
            args += ["--reasoning-parser", "openai_gptoss", "--tool-call-parser", "openai", "--enable-auto-tool-choice"]
        args += ["--host", host, "--port", str(port)]
    elif server == "sglang":
        args = ["python", "-m", "sglang.launch_server", "--model-path", target, "--speculative-algorithm", "DFLASH",
                "--speculative-draft-model-path", draft, "--speculative-num-draft-tokens", str(block)]
        if p.dtype != "auto":
            args += ["--dtype", p.dtype]
        if qwen3:
            args += ["--reasoning-parser", "qwen3"]
        if gpt_oss:
            args += ["--reasoning-parser", "gpt-oss", "--tool-call-parser", "gpt-oss"]
        args += ["--host", host, "--port", str(port)]
    else:
        raise UserError(f"Server {server!r} is unknown; choose vllm or sglang.")
    if p.draft_window:
        notes.append(f"draft_window {p.draft_window} has no flag on {server}; the draft's own window applies")
    return " ".join(shlex.quote(a) for a in args), notes
