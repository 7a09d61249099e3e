"""The training run: settings, setup, the optimisation loop, validation by the real decoding loop, and
resumable state. Data, responses and the objective live in their own modules; nothing here prints
(progress goes to a callback; the CLI draws the bar)."""

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

from dflash_tui.engines import files
from dflash_tui.engines.checkpoints import (
    Dflash2Dims,
    DraftInfo,
    TargetInfo,
    default_target_layer_ids,
    dflash2_config,
    draft_config,
)
from dflash_tui.engines.config import MAX_BLOCK_SIZE
from dflash_tui.engines.cuda.draft import DFlashDraft, save_draft
from dflash_tui.engines.cuda.engine import pick_device
from dflash_tui.engines.cuda.loop import Sampler, speculative_decode
from dflash_tui.engines.cuda.target import Target
from dflash_tui.engines.cuda.training import data
from dflash_tui.engines.cuda.training.objective import BlockObjective, bf16_autocast_pays, default_gamma
from dflash_tui.engines.cuda.training.responses import Responses
from dflash_tui.engines.errors import UserError, describe
from dflash_tui.engines.outputs import CARD, MARKER, check_output_dir, claim_output_dir, draft_card, mask_spelling, publish
from dflash_tui.engines.prompting import load_tokenizer
from dflash_tui.engines.sampling import SamplingParams
from dflash_tui.engines.text import printable

STATE_FILE = "train_state.pt"
SAVE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


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
    init_draft: Optional[str] = None  # start from this draft's weights instead of random ones
    arch: str = "dflash"  # or "dflash2": add the candidate selector and the dynamic convolutions
    selector_top_k: int = 8  # DFlash 2: candidates per mask slot
    gen_batch: int = 1  # responses written per batch; 1 = one at a time through the real decoding loop
    work_dir: Optional[str] = None  # where responses.jsonl and train_state.pt live; None: out
    save_every_s: float = 300.0  # write train_state.pt this often during training


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


@dataclass
class Result:
    steps: int
    loss: float
    tau: float
    taus: list[float] = field(default_factory=list)
    steps_per_s: float = 0.0
    tokens_per_s: float = 0.0
    out: str = ""


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


def check_args(c: TrainConfig) -> None:
    """Every option that is wrong on its face, before anything is read or loaded."""
    if not 2 <= c.block_size <= MAX_BLOCK_SIZE:
        raise UserError(f"--block-size {c.block_size} is out of range; a draft needs a block size from 2 to {MAX_BLOCK_SIZE}.")
    if not 1 <= c.draft_layers <= 64:
        raise UserError(f"--draft-layers {c.draft_layers} is out of range; use 1 to 64 (the public drafts use 1 to 8).")
    checks = [
        (c.epochs >= 1, f"--epochs {c.epochs} must be at least 1"),
        (c.lr > 0, f"--lr {c.lr} must be positive"),
        (c.batch_size >= 1, f"--batch-size {c.batch_size} must be at least 1"),
        (c.max_len >= c.block_size + 2, f"--max-len {c.max_len} must exceed the block size plus 1"),
        (c.gamma is None or (math.isfinite(c.gamma) and c.gamma > 0), f"--gamma {c.gamma} must be a positive number"),
        (0 <= c.seed < 2**32, f"--seed {c.seed} is outside 0 to {2**32 - 1} (what torch's generators take)"),
        (c.anchors_per_seq >= 1, f"--anchors-per-seq {c.anchors_per_seq} must be at least 1"),
        (c.max_steps is None or c.max_steps >= 1, f"--max-steps {c.max_steps} must be at least 1"),
        (c.responses in ("generate", "given"), f"--responses {c.responses} is unknown (use generate or given)"),
        (c.gen_batch >= 1, f"--gen-batch {c.gen_batch} must be at least 1"),
        (c.dtype in SAVE_DTYPES, f"--dtype {c.dtype} is unknown (use float32, float16 or bfloat16)"),
        (c.compute in ("auto", "float32", "bfloat16"), f"--compute {c.compute} is unknown (use auto, float32 or bfloat16)"),
        (c.arch in ("dflash", "dflash2"), f"--arch {c.arch} is unknown (use dflash or dflash2)"),
        (1 <= c.selector_top_k <= 256, f"--selector-top-k {c.selector_top_k} is outside 1-256"),
    ]
    for ok, what in checks:
        if not ok:
            raise UserError(what + "; fix the option and rerun.")


def mask_id(tokenizer, given: Optional[str], info: TargetInfo) -> int:
    """The mask token: --mask-token, else a mask token the tokenizer has, else the first spare row."""
    if given is not None:
        chosen = given_mask_id(tokenizer, given)
        if chosen in info.stop_ids():  # every mask slot would read as the end of the answer
            raise UserError(printable(f"--mask-token '{given}' is the target's stop token {chosen}; name a token the "
                                      "target never writes, such as <|mask|>, or leave it out to take a spare row."))
        return chosen
    vocab = tokenizer.get_vocab()
    for name in ("<|mask|>", "<|MASK|>", "<mask>", "[MASK]", "<|mask_token|>"):
        if name in vocab:
            return vocab[name]
    # Like the public Qwen3 drafts: the first embedding row no token uses (151669 on Qwen3).
    if len(tokenizer) < info.vocab_size:
        return len(tokenizer)
    if tokenizer.pad_token_id is not None and tokenizer.pad_token_id not in info.stop_ids():
        return tokenizer.pad_token_id
    raise UserError("The target's tokenizer has no mask token and no spare embedding row; pass --mask-token with a rarely used token.")


def given_mask_id(tokenizer, given: str) -> int:
    """--mask-token's id: a number is the id itself, else the one token the text names."""
    if str(given).isdigit():
        return int(given)
    ids = tokenizer.convert_tokens_to_ids([given])
    if ids and ids[0] is not None and ids[0] != tokenizer.unk_token_id:
        return int(ids[0])
    encoded = tokenizer.encode(given, add_special_tokens=False)
    if len(encoded) == 1:
        return encoded[0]
    raise UserError(printable(f"--mask-token '{given}' is not a single token of the target's tokenizer; name one token "
                              "or give its id."))


def dflash2_dims(hidden: int, top_k: int) -> Dflash2Dims:
    """A new DFlash 2 draft's sizes (docs/dflash2.md, "Training"): 4 taps, 8 channel groups (fewer where
    8 does not divide the hidden size), a selector of min(hidden, 64) dimensions."""
    groups = max(g for g in (8, 4, 2, 1) if hidden % g == 0)
    return Dflash2Dims(taps=4, groups=groups, selector_dim=min(hidden, 64), top_k=top_k)


class Trainer:
    def __init__(self, cfg: TrainConfig, progress: Optional[Callable[[Progress], None]] = None):
        self.cfg = cfg
        self.progress = progress or (lambda p: None)
        self.out = Path(cfg.out).expanduser()
        self.work = Path(cfg.work_dir).expanduser() if cfg.work_dir else self.out
        check_args(cfg)
        self.conversations = data.load_conversations(cfg.data)  # bad data fails before any weight loads
        self.info = TargetInfo.read(cfg.target)
        self.folders = {"--out": self.out, "--work-dir": self.work} if cfg.work_dir else {"--out": self.out}
        for option, folder in self.folders.items():  # engines/outputs.py: whose folders train-draft writes
            check_output_dir(folder, option=option, target=self.info.path, data=Path(cfg.data))
        if self.info.max_positions and cfg.max_len > self.info.max_positions:
            cfg.max_len = int(self.info.max_positions)  # no sequence beyond the target's context
        L = self.info.num_layers
        if cfg.target_layer_ids is None:
            self.layer_ids = default_target_layer_ids(L, cfg.draft_layers)
        else:
            self.layer_ids = parse_layer_ids(cfg.target_layer_ids if isinstance(cfg.target_layer_ids, str)
                                             else ",".join(map(str, cfg.target_layer_ids)), L)
        self.tokenizer = load_tokenizer(self.info.path)
        self.mask_id = mask_id(self.tokenizer, cfg.mask_token, self.info)
        self.eos = self.info.stop_ids()
        self.gamma = cfg.gamma if cfg.gamma is not None else default_gamma(cfg.block_size)
        self.draft_config = draft_config(self.info.config, cfg.draft_layers, self.layer_ids, cfg.block_size, self.mask_id)
        self.dims = None
        if cfg.arch == "dflash2":  # (every size the public readers index: checkpoints.dflash2_config)
            self.dims = dflash2_dims(self.draft_config["hidden_size"], cfg.selector_top_k)
            self.draft_config = dflash2_config(self.draft_config, self.dims)
        init = self._check_init(cfg.init_draft) if cfg.init_draft else None  # before any weight loads
        for option, folder in self.folders.items():  # take them now: an unwritable one fails before the work
            claim_output_dir(folder, option=option)
        self.device = pick_device(cfg.device)
        cuda = self.device.type == "cuda"
        if cuda:
            torch.backends.cuda.matmul.allow_tf32 = True
        self.target = Target(self.info, self.device, torch.bfloat16 if cuda else torch.float32, self.layer_ids)
        self.target.model.requires_grad_(False)
        vocab_rows = self.target.embed.weight.shape[0]
        if not 0 <= self.mask_id < vocab_rows:
            raise UserError(f"The mask token id {self.mask_id} is outside the target's {vocab_rows} embedding rows; "
                            "pass --mask-token with a token the target's vocabulary has.")
        torch.manual_seed(cfg.seed)
        self.draft = DFlashDraft(self.draft_config, self.dims).to(self.device)
        self.draft.rotary.to(self.device)
        # DFlash 2 (self.dims): the convolutions start as the identity, the codebooks small and random
        for layer in self.draft.layers:
            for conv in (layer.attention_conv, layer.mlp_conv):
                if conv is not None:
                    conv.identity_()
        selector = self.draft.candidate_selector
        if selector is not None:
            for book in (selector.predecessor_codebook, selector.successor_codebook):
                torch.nn.init.normal_(book, std=0.02)
        self.init_digest = self._start_from(init) if init else None
        autocast = bf16_autocast_pays(self.device) if cfg.compute == "auto" else cfg.compute == "bfloat16"
        self.objective = BlockObjective(self.target, self.draft, self.layer_ids, cfg.block_size, cfg.anchors_per_seq,
                                        self.gamma, self.mask_id, autocast)
        self.responses = Responses(self.target, self.tokenizer, self.eos, self.info.path, self.work, cfg.max_len,
                                   cfg.max_new_tokens, cfg.gen_batch, cfg.data, self._responses_progress)

    def _check_init(self, folder: str) -> DraftInfo:
        """Fine-tuning: the draft begins with the weights of an existing one (e.g. a published draft for
        the base of a fine-tuned target). Its shape, target layers, mask id and block size must be the
        ones this run trains, else the weights mean something else."""
        info = DraftInfo.read(folder)
        fields = ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "vocab_size")
        differ = [f for f in fields if info.config.get(f) != self.draft_config.get(f)]
        if info.block_size != self.draft_config["block_size"]:  # (read from either place: checkpoints)
            differ.append("block_size")
        if info.target_layer_ids != self.layer_ids:
            differ.append("target_layer_ids")
        if info.config.get("dflash_config", {}).get("mask_token_id") != self.mask_id:
            differ.append("mask_token_id")
        if differ:
            raise UserError(f"--init-draft {folder} differs from the draft this run trains in {', '.join(differ)}; "
                            "pass the matching --block-size, --draft-layers, --target-layer-ids and --mask-token, or drop --init-draft.")
        if info.arch == "dflash2" and self.cfg.arch != "dflash2":
            raise UserError(f"--init-draft {folder} is a DFlash 2 draft; pass --arch dflash2 to go on training it "
                            "(a DFlash 1 run would drop its selector and convolutions).")
        if info.dflash2 is not None and info.dflash2 != self.dims:
            raise UserError(f"--init-draft {folder} has selector and convolution sizes {info.dflash2}, not this run's "
                            f"{self.dims}; pass the matching --selector-top-k or drop --init-draft.")
        return info

    def _start_from(self, info: DraftInfo) -> str:
        """Load the checked draft's weights; their digest joins the resume key. A DFlash 1 draft starts a
        DFlash 2 run: its backbone is taken, the convolutions stay the identity and the selector as drawn."""
        loaded = DFlashDraft.load(info, self.device, torch.float32)
        missing, _ = self.draft.load_state_dict(loaded.state_dict(), strict=False)
        assert all(".attention_conv." in k or ".mlp_conv." in k or k.startswith("candidate_selector.")
                   for k in missing), missing  # _check_init matched everything else
        return ",".join(_file_digest(f) for f in sorted(Path(info.path).glob("*.safetensors")))

    def _responses_progress(self, message: str, done: int, total: int) -> None:
        self.progress(Progress("generate", done, total, message=message))

    def key(self) -> dict:
        """What a saved state must agree with to be resumed."""
        c = self.cfg
        return {
            "target": str(Path(self.info.path).resolve()), "data": _file_digest(Path(c.data).expanduser()),
            "block_size": c.block_size, "draft_layers": c.draft_layers, "target_layer_ids": self.layer_ids,
            "mask_token_id": self.mask_id, "lr": c.lr, "batch_size": c.batch_size, "max_len": c.max_len,
            "gamma": self.gamma, "seed": c.seed, "responses": c.responses, "anchors_per_seq": c.anchors_per_seq,
            "init_draft": self.init_digest, "arch": c.arch, "selector_top_k": c.selector_top_k if self.dims else None,
        }

    # -- data ----------------------------------------------------------------------------------
    def split(self) -> tuple[list[data.Conversation], list[data.Conversation]]:
        return data.split(self.conversations, self.cfg.val_prompts, self.cfg.seed)

    def val_prompts(self, held: list[data.Conversation]) -> list[list[int]]:
        return data.first_prompts(self.tokenizer, held, self.cfg.max_len)

    def samples(self, train: list[data.Conversation]) -> list[data.Sample]:
        """(prompt, response) ids for every assistant turn: the data's, or the target's (cached)."""
        if self.cfg.responses == "given":
            return self.responses.given(train)
        return self.responses.generated(train)

    def epoch_batches(self, samples: list[data.Sample], epoch: int) -> list[list[int]]:
        """ceil(n / batch) batches of sample indices for an epoch, from a seeded shuffle. (Length-sorted
        groups padded less but trained measurably worse per step here, so batches stay random.)"""
        bs = self.cfg.batch_size
        gen = torch.Generator().manual_seed(self.cfg.seed * 1000003 + epoch)
        order = torch.randperm(len(samples), generator=gen).tolist()
        return [order[j: j + bs] for j in range(0, len(order), bs)]

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
        state = {"version": 1, "key": self.key(), "step": step, "taus": taus,
                 "model": self.draft.state_dict(), "optimizer": optimizer.state_dict()}
        try:  # a new file under an unpredictable name, renamed into place: no link is ever written through
            files.write_file(path, lambda fh: torch.save(state, fh), mode=None)
        except (OSError, RuntimeError) as exc:  # a full disk is torch's RuntimeError "[enforce fail …]"
            option = "--work-dir" if self.cfg.work_dir else "--out"
            raise UserError(printable(f"{path} cannot be written ({describe(exc)}); free space in {option} "
                                      f"{self.work} or pass another --work-dir, and rerun to resume from the last "
                                      "saved state.")) from None
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
        """The draft in the public layout, its model card, and a marker saying where it came from
        (engines/outputs.py). The mask token's spelling goes into dflash_config.mask_token: SGLang checks
        it against the tokenizer, and without it assumes <|MASK|>."""
        token, clash = mask_spelling(self.tokenizer, self.mask_id)
        if token is not None:
            self.draft.config["dflash_config"]["mask_token"] = token
        target_dtype = self.info.config.get("torch_dtype") or self.info.config.get("dtype") or "bfloat16"

        def write(folder: Path) -> None:
            save_draft(self.draft, folder, SAVE_DTYPES[self.cfg.dtype])
            (folder / CARD).write_text(draft_card(
                json.loads((folder / "config.json").read_text()), target=str(self.cfg.target),
                draft=str(self.out.resolve()), steps=step, tau=tau if tau == tau else None,
                target_dtype=str(target_dtype), mask_token=token, sglang_mask_clash=clash))
            made = {"written_by": "dflash train-draft", "target": str(self.cfg.target), "data": str(self.cfg.data),
                    "block_size": self.cfg.block_size, "steps": step, "tau": tau if tau == tau else None, "key": self.key()}
            (folder / MARKER).write_text(json.dumps(made, indent=2) + "\n")

        publish(self.out, write)

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
                loss, _ = self.objective.loss(batch, generator)
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
        report(Progress("validate", step, horizon, tau=tau, epoch=math.ceil(step / per_epoch)))  # the epoch it ended in
        self.save_state(step, optimizer, taus)
        self.save_draft(step, tau)
        return Result(steps=step, loss=loss_avg if loss_avg is not None else float("nan"), tau=tau, taus=taus,
                      steps_per_s=(step - first_step) / elapsed, tokens_per_s=tokens_done / elapsed, out=str(self.out))


def train_draft(cfg: TrainConfig, progress: Optional[Callable[[Progress], None]] = None) -> Result:
    """Train (or resume training) a draft as `cfg` says; returns the figures and writes cfg.out."""
    return Trainer(cfg, progress).run()
