"""Training a DFlash draft for a target (DESIGN.md, training recipe), in PyTorch.

The recipe: the target writes (or the data gives) assistant responses; random anchors are drawn among
response positions; a block is [token at anchor, mask x (B-1)] at positions anchor..anchor+B-1; it sees
the target's context features at positions strictly before its anchor and attends bidirectionally
inside itself; cross-entropy on block positions 1..B-1 against the true tokens at anchor+k, weighted
exp(-(k-1)/gamma). Embeddings and lm_head are the target's, frozen, and not saved with the draft.

All anchors of a batch of sequences go through the draft in ONE forward pass: the query rows of a
sequence are all its blocks side by side, the keys are [every context position, every block position],
and a boolean mask lets each block see context < its anchor and its own block only.

Nothing here prints: progress goes to a callback (the CLI draws the bar).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from ..checkpoints import TargetInfo, default_target_layer_ids, draft_config
from ..config import MAX_BLOCK_SIZE
from ..errors import UserError
from ..outputs import MARKER, check_output_dir, publish
from ..prompting import chat_ids, load_tokenizer
from ..sampling import SamplingParams
from .draft import DFlashDraft, save_draft
from .loop import Sampler, speculative_decode
from .target import Target

STATE_FILE = "train_state.pt"
RESPONSES_FILE = "responses.jsonl"
SAVE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def bf16_autocast_pays(device: torch.device) -> bool:
    """Whether bfloat16 autocast speeds training up on `device`: on a GPU, and on a CPU with native bf16
    matmuls (about 1.9x per step there); CPUs without them would emulate it, slower than float32."""
    return device.type == "cuda" or (device.type == "cpu" and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def default_gamma(block_size: int) -> float:
    """The loss decay: 7 for B=16 and 4 for B=8 (DESIGN.md), linear in B elsewhere, at least 1."""
    return max(1.0, 4.0 + (block_size - 8) * 3.0 / 8.0)


@dataclass
class TrainConfig:
    target: str
    data: str
    out: str
    block_size: int = 16
    draft_layers: int = 2
    target_layer_ids: Optional[list[int]] = None  # None: default_target_layer_ids(L, draft_layers)
    epochs: int = 3
    lr: float = 1e-3
    batch_size: int = 8
    max_len: int = 512
    gamma: Optional[float] = None  # None: default_gamma(block_size)
    seed: int = 0
    responses: str = "generate"  # "generate" (the target writes them) or "given"
    anchors_per_seq: int = 12
    max_steps: Optional[int] = None
    dtype: str = "float32"  # the saved draft's dtype
    compute: str = "auto"  # "auto", "float32" or "bfloat16" (autocast; master weights stay float32)
    mask_token: Optional[str] = None  # a token string, or a number = the id itself
    val_prompts: Optional[int] = None  # None: min(16, 5% of conversations), at least 1
    val_max_new: int = 96
    max_new_tokens: Optional[int] = None  # per generated response; None: up to max_len
    device: str = "auto"
    warmup: Optional[int] = None  # None: 5% of the steps, at most 100
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    fresh: bool = False  # ignore a saved train_state.pt
    gen_batch: int = 1  # responses written per batch; 1 = one at a time through the real decoding loop
    work_dir: Optional[str] = None  # where responses.jsonl and train_state.pt live; None: out
    save_every_s: float = 300.0  # write train_state.pt this often during training


# -- data -------------------------------------------------------------------------------------------

@dataclass
class Conversation:
    messages: list[dict]
    thinking: bool
    line: int
    raw: str  # the JSONL line, for the response cache key


def _bad(path: Path, line: int, what: str) -> UserError:
    return UserError(f"{path}:{line}: {what}; each line must be a JSON object with \"turns\" (alternating user/assistant "
                     "texts, user first) or \"messages\" (role/content objects).")


def load_conversations(path: str) -> list[Conversation]:
    """Every conversation of a JSONL file; a malformed line is a UserError naming file:line."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise UserError(f"The data file {path} does not exist; pass a JSONL file of conversations with --data.")
    out: list[Conversation] = []
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"The data file {path} cannot be read ({exc}); pass a UTF-8 JSONL file.") from None
    for n, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            raise _bad(file, n, f"not valid JSON ({exc.msg})") from None
        if not isinstance(record, dict):
            raise _bad(file, n, "not a JSON object")
        thinking = record.get("thinking", True)
        if not isinstance(thinking, bool):
            raise _bad(file, n, "\"thinking\" is not true or false")
        if "turns" in record:
            turns = record["turns"]
            if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
                raise _bad(file, n, "\"turns\" is not a non-empty list of strings")
            messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
        elif "messages" in record:
            messages = record["messages"]
            if (not isinstance(messages, list) or not messages or not all(
                    isinstance(m, dict) and m.get("role") in ("system", "user", "assistant") and isinstance(m.get("content"), str)
                    for m in messages)):
                raise _bad(file, n, "\"messages\" is not a non-empty list of {role: system|user|assistant, content: text}")
            messages = [{"role": m["role"], "content": m["content"]} for m in messages]
        else:
            raise _bad(file, n, "it has neither \"turns\" nor \"messages\"")
        if not any(m["role"] == "user" for m in messages):
            raise _bad(file, n, "it has no user turn")
        out.append(Conversation(messages, thinking, n, text))
    if not out:
        raise UserError(f"The data file {path} holds no conversations; add one JSON object per line.")
    return out


@dataclass
class Sample:
    prompt: list[int]
    response: list[int]

    @property
    def ids(self) -> list[int]:
        return self.prompt + self.response


def _template(tokenizer, messages: list[dict], thinking: bool, generation_prompt: bool) -> list[int]:
    if generation_prompt:
        return chat_ids(tokenizer, messages, thinking)
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=False, tokenize=True,
                                        enable_thinking=thinking, return_dict=False)
    if isinstance(out, dict) or hasattr(out, "keys"):
        out = out["input_ids"]
    return list(out)


def given_response_ids(tokenizer, history: list[dict], content: str, thinking: bool, eos: list[int]) -> list[int]:
    """The ids the target would write for `content` after `history`: the chat template's rendering of the
    assistant turn up to and including its end-of-turn token."""
    prompt = chat_ids(tokenizer, history, thinking)
    full = _template(tokenizer, history + [{"role": "assistant", "content": content}], thinking, False)
    if full[: len(prompt)] == prompt and len(full) > len(prompt):
        ids = full[len(prompt):]
        end = next((i for i, t in enumerate(ids) if t in eos), None)
        return ids[: end + 1] if end is not None else ids
    # The template renders history differently from a generation prompt: tokenize the text itself.
    return tokenizer.encode(content, add_special_tokens=False) + eos[:1]


# -- the trainer -----------------------------------------------------------------------------------

@dataclass
class Progress:
    kind: str  # "generate", "step", "validate", "info"
    done: int = 0
    total: int = 0
    loss: float = 0.0
    tokens_per_s: float = 0.0
    steps_per_s: float = 0.0
    lr: float = 0.0
    tau: float = 0.0
    epoch: int = 0
    message: str = ""


class Interrupted(Exception):
    """Training stopped by Ctrl-C; the state was saved at `step`."""

    def __init__(self, step: int, path: Path):
        super().__init__(f"interrupted at step {step}; state saved to {path}")
        self.step, self.path = step, path


class _StopForward(Exception):
    pass


@dataclass
class Result:
    steps: int
    loss: float
    tau: float
    taus: list[float] = field(default_factory=list)
    steps_per_s: float = 0.0
    tokens_per_s: float = 0.0
    out: str = ""


def _pick_device(name: str) -> torch.device:
    from .engine import pick_device

    return pick_device(name)


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def parse_layer_ids(text: str, num_layers: int) -> list[int]:
    """'1,3' -> [1, 3], checked against the target's layer count."""
    try:
        ids = [int(x) for x in str(text).replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise UserError(f"--target-layer-ids '{text}' is not a comma-separated list of layer numbers; write e.g. 1,3.") from None
    if not ids:
        raise UserError("--target-layer-ids is empty; give at least one target layer number, e.g. 1,3.")
    bad = [i for i in ids if not 0 <= i < num_layers]
    if bad:
        raise UserError(f"--target-layer-ids {bad} are outside this {num_layers}-layer target; use numbers from 0 to {num_layers - 1}.")
    if len(set(ids)) != len(ids):
        raise UserError(f"--target-layer-ids {ids} repeats a layer; list each target layer once.")
    return ids


class Trainer:
    def __init__(self, cfg: TrainConfig, progress: Optional[Callable[[Progress], None]] = None):
        self.cfg = cfg
        self.progress = progress or (lambda p: None)
        self.out = Path(cfg.out).expanduser()
        self.work = Path(cfg.work_dir).expanduser() if cfg.work_dir else self.out
        self._check_args()
        self.conversations = load_conversations(cfg.data)  # bad data fails before any weight loads
        self.info = TargetInfo.read(cfg.target)
        check_output_dir(self.out, option="--out", target=self.info.path, data=Path(cfg.data))
        if cfg.work_dir:
            check_output_dir(self.work, option="--work-dir", target=self.info.path, data=Path(cfg.data), writes_model=False)
        if self.info.max_positions and cfg.max_len > self.info.max_positions:
            cfg.max_len = int(self.info.max_positions)  # no sequence beyond the target's context
        L = self.info.num_layers
        if cfg.target_layer_ids is None:
            self.layer_ids = default_target_layer_ids(L, cfg.draft_layers)
        else:
            self.layer_ids = parse_layer_ids(",".join(map(str, cfg.target_layer_ids)), L) \
                if not isinstance(cfg.target_layer_ids, str) else parse_layer_ids(cfg.target_layer_ids, L)
        self.tokenizer = load_tokenizer(self.info.path)
        self.mask_id = self._mask_id()
        self.eos = self.info.stop_ids()
        self.gamma = cfg.gamma if cfg.gamma is not None else default_gamma(cfg.block_size)
        self.device = _pick_device(cfg.device)
        self.cuda = self.device.type == "cuda"
        if self.cuda:
            torch.backends.cuda.matmul.allow_tf32 = True
        self.target = Target(self.info, self.device, torch.bfloat16 if self.cuda else torch.float32, self.layer_ids)
        self.target.model.requires_grad_(False)
        self.autocast = bf16_autocast_pays(self.device) if cfg.compute == "auto" else cfg.compute == "bfloat16"
        self.vocab_rows = self.target.embed.weight.shape[0]
        if not 0 <= self.mask_id < self.vocab_rows:
            raise UserError(f"The mask token id {self.mask_id} is outside the target's {self.vocab_rows} embedding rows; "
                            "pass --mask-token with a token the target's vocabulary has.")
        decoder = self.target.model.model
        last = len(decoder.layers) - 1
        top = max(self.layer_ids)
        self._stopping = False
        if top < last:  # nothing above the highest hooked layer is needed for the features
            decoder.layers[top].register_forward_hook(self._stop_hook)
        self.draft_config = draft_config(self.info.config, cfg.draft_layers, self.layer_ids, cfg.block_size, self.mask_id)
        torch.manual_seed(cfg.seed)
        self.draft = DFlashDraft(self.draft_config).to(self.device)
        self.draft.rotary.to(self.device)

    # -- setup ---------------------------------------------------------------------------------
    def _check_args(self) -> None:
        c = self.cfg
        if not 2 <= c.block_size <= MAX_BLOCK_SIZE:
            raise UserError(f"--block-size {c.block_size} is out of range; a draft needs a block size from 2 to {MAX_BLOCK_SIZE}.")
        if not 1 <= c.draft_layers <= 64:
            raise UserError(f"--draft-layers {c.draft_layers} is out of range; use 1 to 64 (the public drafts use 1 to 8).")
        checks = [
            (c.epochs >= 1, f"--epochs {c.epochs} must be at least 1"),
            (c.lr > 0, f"--lr {c.lr} must be positive"),
            (c.batch_size >= 1, f"--batch-size {c.batch_size} must be at least 1"),
            (c.max_len >= c.block_size + 2, f"--max-len {c.max_len} must exceed the block size plus 1"),
            (c.gamma is None or c.gamma > 0, f"--gamma {c.gamma} must be positive"),
            (c.anchors_per_seq >= 1, f"--anchors-per-seq {c.anchors_per_seq} must be at least 1"),
            (c.max_steps is None or c.max_steps >= 1, f"--max-steps {c.max_steps} must be at least 1"),
            (c.responses in ("generate", "given"), f"--responses {c.responses} is unknown (use generate or given)"),
            (c.gen_batch >= 1, f"--gen-batch {c.gen_batch} must be at least 1"),
            (c.dtype in SAVE_DTYPES, f"--dtype {c.dtype} is unknown (use float32, float16 or bfloat16)"),
            (c.compute in ("auto", "float32", "bfloat16"), f"--compute {c.compute} is unknown (use auto, float32 or bfloat16)"),
        ]
        for ok, what in checks:
            if not ok:
                raise UserError(what + "; fix the option and rerun.")

    def _mask_id(self) -> int:
        tok, given = self.tokenizer, self.cfg.mask_token
        if given is not None:
            if str(given).isdigit():
                return int(given)
            ids = tok.convert_tokens_to_ids([given])
            if ids and ids[0] is not None and ids[0] != tok.unk_token_id:
                return int(ids[0])
            encoded = tok.encode(given, add_special_tokens=False)
            if len(encoded) == 1:
                return encoded[0]
            raise UserError(f"--mask-token '{given}' is not a single token of the target's tokenizer; name one token or give its id.")
        vocab = tok.get_vocab()
        for name in ("<|mask|>", "<|MASK|>", "<mask>", "[MASK]", "<|mask_token|>"):
            if name in vocab:
                return vocab[name]
        # Like the public Qwen3 drafts: the first embedding row no token uses (151669 on Qwen3).
        if len(tok) < self.info.vocab_size:
            return len(tok)
        if tok.pad_token_id is not None and tok.pad_token_id not in self.info.stop_ids():
            return tok.pad_token_id
        raise UserError("The target's tokenizer has no mask token and no spare embedding row; pass --mask-token with a rarely used token.")

    def _stop_hook(self, module, args, output):
        if self._stopping:
            raise _StopForward

    def key(self) -> dict:
        """What a saved state must agree with to be resumed."""
        c = self.cfg
        return {
            "target": str(Path(self.info.path).resolve()), "data": _file_digest(Path(c.data).expanduser()),
            "block_size": c.block_size, "draft_layers": c.draft_layers, "target_layer_ids": self.layer_ids,
            "mask_token_id": self.mask_id, "lr": c.lr, "batch_size": c.batch_size, "max_len": c.max_len,
            "gamma": self.gamma, "seed": c.seed, "responses": c.responses, "anchors_per_seq": c.anchors_per_seq,
        }

    # -- data ----------------------------------------------------------------------------------
    def split(self) -> tuple[list[Conversation], list[Conversation]]:
        """(train, held out): a seeded shuffle, the held-out slice is the last few conversations."""
        n = len(self.conversations)
        order = torch.randperm(n, generator=torch.Generator().manual_seed(self.cfg.seed)).tolist()
        n_val = self.cfg.val_prompts if self.cfg.val_prompts is not None else min(16, max(1, n // 20))
        n_val = min(n_val, n - 1) if n > 1 else 0
        train = [self.conversations[i] for i in order[: n - n_val]]
        held = [self.conversations[i] for i in order[n - n_val:]] if n_val else list(train)
        return train, held

    def val_prompts(self, held: list[Conversation]) -> list[list[int]]:
        prompts = []
        for conv in held:
            first = next(i for i, m in enumerate(conv.messages) if m["role"] == "assistant") \
                if any(m["role"] == "assistant" for m in conv.messages) else len(conv.messages)
            ids = chat_ids(self.tokenizer, conv.messages[:first], conv.thinking)
            if len(ids) < self.cfg.max_len:
                prompts.append(ids)
        return prompts

    def _max_new(self, prompt: list[int]) -> int:
        room = self.cfg.max_len - len(prompt)
        return min(room, self.cfg.max_new_tokens or room)

    def _generate(self, prompts: list[list[int]]) -> list[list[int]]:
        """The target's greedy responses, each up to and including its first stop id. One at a time
        through the real loop at block size 1, or batched through transformers' generate (--gen-batch)."""
        if len(prompts) == 1 or self.cfg.gen_batch <= 1:
            out = []
            for prompt in prompts:
                ids: list[int] = []
                for step in speculative_decode(self.target, None, prompt, 1, self._max_new(prompt),
                                               Sampler(SamplingParams(), self.device)):
                    ids += step.emitted
                    if step.emitted[-1] in self.eos:
                        break
                out.append(ids)
            return out
        width = max(len(p) for p in prompts)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        with torch.inference_mode():
            out = self.target.model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=max(self._max_new(p) for p in prompts),
                do_sample=False, temperature=None, top_p=None, top_k=None, eos_token_id=self.eos or None,
                pad_token_id=pad)
        written = []
        for row, prompt in zip(out[:, width:].tolist(), prompts):
            end = next((i for i, t in enumerate(row) if t in self.eos), None)
            written.append(row[: end + 1 if end is not None else len(row)][: self._max_new(prompt)])
        return written

    def _target_key(self) -> str:
        h = hashlib.sha256((Path(self.info.path) / "config.json").read_bytes())
        for f in sorted(Path(self.info.path).glob("*.safetensors")):
            h.update(f"{f.name}:{f.stat().st_size}".encode())
        return h.hexdigest()[:16]

    def samples(self, train: list[Conversation]) -> list[Sample]:
        """(prompt, response) ids for every assistant turn; with `generate` the target writes each
        response (greedy, block size 1 through the real loop), cached in OUT/responses.jsonl."""
        c, tok = self.cfg, self.tokenizer
        samples: list[Sample] = []
        if c.responses == "given":
            for conv in train:
                for i, m in enumerate(conv.messages):
                    if m["role"] == "assistant" and i:
                        prompt = chat_ids(tok, conv.messages[:i], conv.thinking)
                        response = given_response_ids(tok, conv.messages[:i], m["content"], conv.thinking, self.eos)
                        samples.append(Sample(prompt, response))
            if not samples:
                raise UserError(f"{c.data} has no assistant turns to train on with --responses given; add them, or "
                                "use --responses generate to let the target write them.")
            return self._fit(samples)
        cache_file = self.work / RESPONSES_FILE
        cached: dict[str, list[list[int]]] = {}
        if cache_file.is_file():
            for text in cache_file.read_text().splitlines():
                try:
                    entry = json.loads(text)
                    cached[entry["key"]] = entry["responses"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue  # a torn last line from an interrupted run
        target_key = self._target_key()
        keys = [hashlib.sha256(f"{target_key}|{c.max_len}|{c.max_new_tokens}|{conv.thinking}|{conv.raw}".encode())
                .hexdigest()[:24] for conv in train]
        todo_convs = [(conv, key) for conv, key in zip(train, keys) if key not in cached]
        todo = sum(sum(1 for m in conv.messages if m["role"] == "user") for conv, _ in todo_convs)
        if todo_convs:
            self.work.mkdir(parents=True, exist_ok=True)
            self.progress(Progress("generate", 0, todo, message="target writes responses"))
            done = 0
            group = max(1, c.gen_batch)
            with open(cache_file, "a") as fh:
                for g in range(0, len(todo_convs), group):
                    chunk = todo_convs[g: g + group]
                    talks = [self._dialogue(conv) for conv, _ in chunk]
                    responses: list[list[list[int]]] = [[] for _ in chunk]
                    prompts = [next(t, None) for t in talks]
                    while any(p is not None for p in prompts):
                        live = [i for i, p in enumerate(prompts) if p is not None]
                        written = self._generate([prompts[i] for i in live])
                        for i, response in zip(live, written):
                            responses[i].append(response)
                            try:
                                prompts[i] = talks[i].send(response)
                            except StopIteration:
                                prompts[i] = None
                        done += len(live)
                        self.progress(Progress("generate", done, todo))
                    for (conv, key), written in zip(chunk, responses):
                        cached[key] = written
                        fh.write(json.dumps({"key": key, "line": conv.line, "responses": written}) + "\n")
                    fh.flush()
        for conv, key in zip(train, keys):
            talk = self._dialogue(conv)
            prompt = next(talk, None)
            for response in cached[key]:
                if prompt is None:
                    break
                samples.append(Sample(prompt, response))
                try:
                    prompt = talk.send(response)
                except StopIteration:
                    prompt = None
        return self._fit(samples)

    def _dialogue(self, conv: Conversation):
        """A generator over a conversation whose assistant turns the target writes: yields each prompt
        (chat template, the record's thinking mode) and receives the response ids written for it."""
        history: list[dict] = []
        for m in conv.messages:
            if m["role"] == "assistant":
                continue  # the target writes its own
            history.append(m)
            if m["role"] != "user":
                continue
            prompt = chat_ids(self.tokenizer, history, conv.thinking)
            if self.cfg.max_len - len(prompt) < 2:
                return
            response = yield prompt
            text = self.tokenizer.decode([t for t in response if t not in self.eos], skip_special_tokens=False)
            history.append({"role": "assistant", "content": text})

    def _fit(self, samples: list[Sample]) -> list[Sample]:
        out = []
        for s in samples:
            keep = self.cfg.max_len - len(s.prompt)
            if keep >= 2 and s.response:
                out.append(Sample(s.prompt, s.response[:keep]))
        if not out:
            raise UserError(f"No conversation of {self.cfg.data} leaves room for a response within --max-len "
                            f"{self.cfg.max_len}; raise --max-len or shorten the prompts.")
        return out

    # -- the objective -------------------------------------------------------------------------
    @torch.no_grad()
    def features(self, ids: torch.Tensor) -> torch.Tensor:
        """Context features [S, T, len(ids) * hidden] for right-padded ids (causal: pads never leak)."""
        t = self.target
        t.capture = self._stopping = True
        try:
            t.model.model(input_ids=ids, use_cache=False)
        except _StopForward:
            pass
        finally:
            t.capture = self._stopping = False
        return torch.cat([t._features.pop(i) for i in self.layer_ids], dim=-1).float()

    def batch_loss(self, batch: list[Sample], generator: torch.Generator) -> tuple[torch.Tensor, int]:
        """The weighted block cross-entropy of one batch, and how many label tokens it covered."""
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            return self._batch_loss(batch, generator)

    def _batch_loss(self, batch: list[Sample], generator: torch.Generator) -> tuple[torch.Tensor, int]:
        B, N, dev = self.cfg.block_size, self.cfg.anchors_per_seq, self.device
        S, T = len(batch), max(len(s.ids) for s in batch)
        ids = torch.zeros(S, T, dtype=torch.long)
        anchors = torch.zeros(S, N, dtype=torch.long)
        anchor_ok = torch.zeros(S, N, dtype=torch.bool)
        lengths = torch.zeros(S, dtype=torch.long)
        for r, s in enumerate(batch):  # per sequence, never per anchor
            seq = s.ids
            ids[r, : len(seq)] = torch.tensor(seq)
            lengths[r] = len(seq)
            lo, hi = len(s.prompt), len(seq) - 1  # anchors: response positions with at least one label after
            count = hi - lo
            if count <= 0:
                continue
            k = min(N, count)
            anchors[r, :k] = lo + torch.randperm(count, generator=generator)[:k]
            anchor_ok[r, :k] = True
        ids, anchors, anchor_ok, lengths = ids.to(dev), anchors.to(dev), anchor_ok.to(dev), lengths.to(dev)

        feats = self.features(ids)  # [S, T, n*H]
        offsets = torch.arange(B, device=dev)
        # The draft trains in float32; a bf16 target (CUDA) gives float32 features and takes bf16 into lm_head.
        hidden = self.block_hiddens(ids, feats, anchors)[:, :, 1:]  # predictions for anchor+1..anchor+B-1
        logits = self.target.lm_head(hidden.to(self.target.lm_head.weight.dtype)).float()
        label_pos = anchors[:, :, None] + offsets[1:]  # [S, N, B-1]
        valid = anchor_ok[:, :, None] & (label_pos < lengths[:, None, None])
        labels = ids.gather(1, label_pos.clamp(max=T - 1).reshape(S, -1)).view(S, N, B - 1)
        weights = torch.exp(-(offsets[1:].float() - 1) / self.gamma)[None, None, :] * valid
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none").view_as(weights)
        loss = (ce * weights).sum() / weights.sum().clamp(min=1e-6)
        return loss, int(valid.sum())

    def block_hiddens(self, ids: torch.Tensor, feats: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        """The draft's final hidden states [S, N, B, H] for N blocks per sequence in one pass: block j of
        row s is [ids[s, a], mask x (B-1)] at positions a..a+B-1 (a = anchors[s, j]); it attends to the
        context at positions < a and to its own block, exactly as in the decoding loop."""
        B, dev = self.cfg.block_size, ids.device
        (S, T), N = ids.shape, anchors.shape[1]
        offsets = torch.arange(B, device=dev)
        pos = (anchors[:, :, None] + offsets).reshape(S, N * B)  # block positions [S, NB]
        tokens = torch.full((S, N, B), self.mask_id, dtype=torch.long, device=dev)
        tokens[:, :, 0] = ids.gather(1, anchors)
        with torch.no_grad():
            embeds = self.target.embed(tokens.reshape(S, N * B)).float()
        block_anchor = anchors.repeat_interleave(B, dim=1)  # [S, NB]
        ctx_ok = torch.arange(T, device=dev)[None, None, :] < block_anchor[:, :, None]  # [S, NB, T]
        block_id = torch.arange(N, device=dev).repeat_interleave(B)
        same = (block_id[:, None] == block_id[None, :]).expand(S, -1, -1)  # [S, NB, NB]
        mask = torch.cat([ctx_ok, same], dim=-1).unsqueeze(1)  # [S, 1, NB, T + NB]
        d = self.draft
        ctx = d.context(feats)
        cos, sin = d.rope(torch.arange(T, device=dev).expand(S, T), ctx)
        kv = [layer.self_attn.project_context(ctx, cos, sin) for layer in d.layers]
        hidden = d.block_hidden(embeds, [k for k, _ in kv], [v for _, v in kv], pos, mask)
        return hidden.view(S, N, B, -1)

    # -- validation ----------------------------------------------------------------------------
    def estimate_tau(self, prompts: list[list[int]], block_size: Optional[int] = None,
                     max_new: Optional[int] = None) -> float:
        """Mean acceptance length of the real loop (temperature 0) with the current draft, pooled over
        every verify step of every prompt."""
        block = block_size or self.cfg.block_size
        max_new = max_new or self.cfg.val_max_new
        was_training = self.draft.training
        self.draft.eval()
        target_dtype = self.target.lm_head.weight.dtype
        # Decode with the draft in the target's dtype, as the engine loads it.
        draft = self.draft
        if target_dtype != torch.float32:
            draft = copy.deepcopy(self.draft).to(target_dtype)
            draft.rotary = self.draft.rotary  # rotary frequencies stay float32, as in DFlashDraft.load
        lengths: list[int] = []
        sampler = Sampler(SamplingParams(), self.device)
        try:
            for prompt in prompts:
                room = min(max_new, (self.info.max_positions or 1 << 30) - len(prompt))
                for step in speculative_decode(self.target, draft, prompt, block, room, sampler):
                    if not step.prefill:
                        lengths.append(step.accepted + 1)
                    if any(t in self.eos for t in step.emitted):
                        break
        finally:
            self.draft.train(was_training)
        return sum(lengths) / len(lengths) if lengths else 0.0

    # -- state ---------------------------------------------------------------------------------
    def save_state(self, step: int, optimizer, taus: list[float]) -> Path:
        self.work.mkdir(parents=True, exist_ok=True)
        path = self.work / STATE_FILE
        tmp = path.with_suffix(".tmp")
        torch.save({"version": 1, "key": self.key(), "step": step, "taus": taus,
                    "model": self.draft.state_dict(), "optimizer": optimizer.state_dict()}, tmp)
        tmp.replace(path)
        return path

    def load_state(self, optimizer) -> tuple[int, list[float]]:
        path = self.work / STATE_FILE
        if self.cfg.fresh or not path.is_file():
            return 0, []
        try:
            state = torch.load(path, map_location=self.device, weights_only=True)
        except Exception as exc:
            raise UserError(f"{path} cannot be read ({type(exc).__name__}); delete it or pass --fresh to start over.") from None
        key = self.key()
        differ = sorted(k for k in key if state.get("key", {}).get(k) != key[k])
        if differ:
            raise UserError(f"{path} was saved with different {', '.join(differ)}; rerun with the same arguments "
                            "to resume, or pass --fresh to start over.")
        self.draft.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        return int(state["step"]), list(state.get("taus", []))

    def save_draft(self, step: int, tau: float) -> None:
        """The draft in the public layout, plus a marker saying where it came from (engines/outputs.py)."""
        def write(folder: Path) -> None:
            save_draft(self.draft, folder, SAVE_DTYPES[self.cfg.dtype])
            made = {"written_by": "dflash train-draft", "target": str(self.cfg.target), "data": str(self.cfg.data),
                    "block_size": self.cfg.block_size, "steps": step, "tau": tau if tau == tau else None, "key": self.key()}
            (folder / MARKER).write_text(json.dumps(made, indent=2) + "\n")

        publish(self.out, write)

    def epoch_batches(self, samples: list[Sample], epoch: int) -> list[list[int]]:
        """ceil(n / batch) batches of sample indices for an epoch, from a seeded shuffle. (Length-sorted
        groups padded less but trained measurably worse per step here, so batches stay random.)"""
        bs = self.cfg.batch_size
        gen = torch.Generator().manual_seed(self.cfg.seed * 1000003 + epoch)
        order = torch.randperm(len(samples), generator=gen).tolist()
        return [order[j: j + bs] for j in range(0, len(order), bs)]

    # -- the loop ------------------------------------------------------------------------------
    def run(self, on_step: Optional[Callable[[Progress], None]] = None) -> Result:
        c = self.cfg
        report = on_step or self.progress
        train, held = self.split()
        samples = self.samples(train)
        prompts = self.val_prompts(held)
        per_epoch = math.ceil(len(samples) / c.batch_size)
        horizon = per_epoch * c.epochs
        if c.max_steps is not None:
            horizon = min(horizon, c.max_steps)
        warmup = c.warmup if c.warmup is not None else max(1, min(100, horizon // 20))
        decay = [p for n, p in self.draft.named_parameters() if p.ndim >= 2]
        rest = [p for n, p in self.draft.named_parameters() if p.ndim < 2]
        optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": c.weight_decay},
                                       {"params": rest, "weight_decay": 0.0}], lr=c.lr, betas=(0.9, 0.95))
        step, taus = self.load_state(optimizer)
        if step:
            report(Progress("info", step, horizon, message=f"resuming at step {step}"))

        def lr_at(s: int) -> float:
            if s < warmup:
                return c.lr * (s + 1) / warmup
            t = min(1.0, (s - warmup) / max(1, horizon - warmup))
            return c.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

        orders: dict[int, list[list[int]]] = {}
        loss_avg = None
        tokens_done, started = 0, time.perf_counter()
        first_step, last_save = step, time.perf_counter()
        tau = taus[-1] if taus else float("nan")
        self.draft.train()
        try:
            while step < horizon:
                epoch, index = divmod(step, per_epoch)
                if epoch not in orders:
                    orders = {epoch: self.epoch_batches(samples, epoch)}
                batch = [samples[i] for i in orders[epoch][index]]
                generator = torch.Generator().manual_seed(c.seed * 1000003 + 7919 * step + 1)
                for group in optimizer.param_groups:
                    group["lr"] = lr_at(step)
                loss, _ = self.batch_loss(batch, generator)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.draft.parameters(), c.grad_clip)
                optimizer.step()
                step += 1
                tokens_done += sum(len(s.ids) for s in batch)
                value = loss.item()
                loss_avg = value if loss_avg is None else 0.95 * loss_avg + 0.05 * value
                elapsed = max(time.perf_counter() - started, 1e-9)
                report(Progress("step", step, horizon, loss=loss_avg, lr=lr_at(step - 1), epoch=epoch,
                                tokens_per_s=tokens_done / elapsed, steps_per_s=(step - first_step) / elapsed))
                if step % per_epoch == 0 and step < horizon:  # an epoch ended: estimate tau
                    paused_at = time.perf_counter()
                    tau = self.estimate_tau(prompts)
                    taus.append(tau)
                    report(Progress("validate", step, horizon, tau=tau, epoch=epoch + 1))
                    self.save_state(step, optimizer, taus)
                    last_save = time.perf_counter()
                    started += last_save - paused_at  # validation is not training time
                elif time.perf_counter() - last_save > c.save_every_s:
                    self.save_state(step, optimizer, taus)
                    last_save = time.perf_counter()
        except KeyboardInterrupt:
            path = self.save_state(step, optimizer, taus)  # the draft itself is written when training ends
            raise Interrupted(step, path) from None
        elapsed = max(time.perf_counter() - started, 1e-9)
        tau = self.estimate_tau(prompts)
        taus.append(tau)
        report(Progress("validate", step, horizon, tau=tau, epoch=step // per_epoch))
        self.save_state(step, optimizer, taus)
        self.save_draft(step, tau)
        return Result(steps=step, loss=loss_avg if loss_avg is not None else float("nan"), tau=tau, taus=taus,
                      steps_per_s=(step - first_step) / elapsed, tokens_per_s=tokens_done / elapsed, out=str(self.out))


def train_draft(cfg: TrainConfig, progress: Optional[Callable[[Progress], None]] = None) -> Result:
    """Train (or resume training) a draft as `cfg` says; returns the figures and writes cfg.out."""
    return Trainer(cfg, progress).run()



__all__ = ["TrainConfig", "Trainer", "train_draft", "load_conversations", "Progress", "Result", "Interrupted",
           "default_gamma", "parse_layer_ids"]
