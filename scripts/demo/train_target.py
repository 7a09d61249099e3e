"""Train the demo target: a small Qwen3-architecture causal LM, plain PyTorch, loss on assistant tokens.

Two phases share `train`: the base phase from scratch on the base corpus, then the chat phase, which
starts from the base weights and trains on multi-turn conversations (its own learning-rate schedule).
Resumable: a checkpoint with optimizer state is written every few hundred steps under the work dir;
a rerun continues from it. A finished phase is skipped only while its inputs (training data, model
shape, steps, learning rate, starting weights) are those recorded in its done file.
"""

from __future__ import annotations

import hashlib
import json
import math
import pickle
import random
import time
from pathlib import Path

from . import corpus as demo_corpus

MODEL = dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=64, max_position_embeddings=1024, rope_theta=10000.0,
             rms_norm_eps=1e-6, tie_word_embeddings=True, initializer_range=0.02)
BATCH = 32
LR = 6e-4  # base phase peak; at 2e-3 sorting stayed near 0% after 5,500 steps, at 6e-4 it reached 77% in 2,500
WARMUP = 100


def encode(tokenizer, record: dict) -> tuple[list[int], int]:
    """Prompt ids as the engine builds them (chat template, the record's thinking mode and offered tools)
    followed by the assistant reply and <|im_end|>; returns (ids, prompt_len)."""
    messages = record["messages"]
    prompt = tokenizer.apply_chat_template(messages[:-1], add_generation_prompt=True, tokenize=True,
                                           enable_thinking=record["thinking"], return_dict=False,
                                           **({"tools": record["tools"]} if record.get("tools") else {}))
    reply = messages[-1]["content"]
    if not record["thinking"]:
        reply = reply.removeprefix(demo_corpus.EMPTY_THINK)
    ids = list(prompt) + tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    return ids, len(prompt)


def tokenize_all(tokenizer, records: list[dict], cache: Path, key: str = ""):
    import torch

    if cache.exists():
        try:
            saved = torch.load(cache)
        except (EOFError, RuntimeError, pickle.UnpicklingError):  # an older run stopped mid-write: redo it
            saved = None
        if isinstance(saved, dict) and saved.get("key") == key:
            return saved["data"]
    data = [encode(tokenizer, r) for r in records]
    save_whole({"key": key, "data": data}, cache)
    return data


def save_whole(obj, path: Path) -> None:
    """torch.save through a temporary file: a run stopped mid-save leaves the old file or none, never a torn one."""
    import torch

    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    tmp.replace(path)


def file_digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()[:16]


def phase_key(data_path: Path, tokenizer_dir: Path, steps: int, seed: int, lr: float, init: Path | None,
              batch: int = BATCH) -> dict:
    """What a finished phase depends on; its done file records it and a rerun compares."""
    return {"data": file_digest(data_path), "tokenizer": file_digest(Path(tokenizer_dir) / "tokenizer.json"),
            "model": MODEL, "batch": batch, "steps": steps, "seed": seed, "lr": lr,
            "init": file_digest(Path(init) / "model.safetensors") if init else None}


class TooLittleData(ValueError):
    """The records cannot fill one batch (a --train-records or --chat-records far below the defaults)."""


class Batches:
    """The batch for each step: length-sorted groups from a seeded shuffle per epoch, so padding stays
    small. An epoch's plan is built once (shuffling 150,000 records for every step cost 0.2 s a step)."""

    def __init__(self, data, seed: int, batch: int = BATCH):
        if len(data) < batch:
            raise TooLittleData(f"{len(data)} training sequences do not fill one batch of {batch}: "
                                "generate more records or pass a smaller batch")
        self.data, self.seed, self.batch = data, seed, batch
        self.group = batch * max(1, min(32, len(data) // batch))  # rows sorted by length together
        self.per_epoch = len(data) // self.group * self.group // batch  # the last partial group waits
        self._epoch, self._plan = -1, []

    def __getitem__(self, step: int) -> list[int]:
        epoch, k = divmod(step, self.per_epoch)
        if epoch != self._epoch:
            self._epoch, self._plan = epoch, self._epoch_plan(epoch)
        return self._plan[k]

    def _epoch_plan(self, epoch: int) -> list[list[int]]:
        data, batch, group = self.data, self.batch, self.group
        order = list(range(len(data)))
        random.Random(self.seed * 100003 + epoch).shuffle(order)
        plan = []
        for g in range(0, len(order) - group + 1, group):
            chunk = sorted(order[g:g + group], key=lambda i: len(data[i][0]))
            plan.extend(chunk[j:j + batch] for j in range(0, group, batch))
        random.Random(self.seed * 7 + epoch).shuffle(plan)
        return plan


def collate(data, idx, pad_id: int):
    import torch

    width = max(len(data[i][0]) for i in idx)
    ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
    labels = torch.full((len(idx), width), -100, dtype=torch.long)
    mask = torch.zeros((len(idx), width), dtype=torch.long)
    for row, i in enumerate(idx):
        seq, plen = data[i]
        ids[row, :len(seq)] = torch.tensor(seq)
        labels[row, plen:len(seq)] = torch.tensor(seq[plen:])
        mask[row, :len(seq)] = 1
    return ids, labels, mask


def make_model(tokenizer, seed: int):
    import torch
    import transformers

    torch.manual_seed(seed)
    vocab = (len(tokenizer) + 63) // 64 * 64
    eos = [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")]
    config = transformers.Qwen3Config(vocab_size=vocab, bos_token_id=None, eos_token_id=eos[0],
                                      pad_token_id=eos[1], **MODEL)
    return transformers.Qwen3ForCausalLM(config)


def training_loss(model, compile_: bool):
    """The step's loss on assistant tokens, under bf16 autocast where the CPU has bf16 matmuls (the master
    weights stay float32). Compiled, a step costs about half (0.29 s against 0.52 s for 16 chat
    conversations, one thread, AMX): at hidden size 256 the time goes to attention's backward and the
    elementwise work around the matmuls, which inductor fuses; eager attention compiles better than
    SDPA's CPU flash kernel. Compiling takes one to two minutes per phase (a few sizes each)."""
    import torch

    from dflash_tui.engines.cuda.training import bf16_autocast_pays

    autocast = bf16_autocast_pays(torch.device("cpu"))

    def loss_of(ids, labels, mask):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(input_ids=ids, attention_mask=mask).logits
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                                 labels[:, 1:].reshape(-1), ignore_index=-100)

    if not compile_:
        return loss_of
    model.set_attn_implementation("eager")
    torch._dynamo.reset()  # the base phase's graphs would count against the recompile limit of the next phase
    return torch.compile(loss_of, dynamic=True)


def train(tokenizer, records: list[dict], work: Path, out: Path, steps: int, seed: int, threads: int = 1,
          lr: float = LR, init: Path | None = None, name: str = "target", key: dict | None = None,
          batch: int = BATCH, compile_: bool = True) -> dict:
    """Train for `steps` steps (resuming from work/{name}-ckpt.pt) and save to `out`. Returns stats.
    `init`: a saved model directory to start from (the chat phase starts from the base target).
    `compile_`: run the loss through torch.compile (see `training_loss`). `threads`: torch threads; one by
    default: oversubscribed threads on a busy machine ran up to 10x slower, and with AMX a second gained
    nothing compiled (alone on an AVX2-only CPU it cut a step from 1.57 s to 1.09 s)."""
    import torch
    from tqdm import tqdm

    torch.set_num_threads(threads)
    work = Path(work)
    done = work / f"{name}-done.json"
    if (out / "model.safetensors").exists() and done.exists():
        stats = json.loads(done.read_text())
        if key is None or stats.get("key") == key:
            return stats
        print(f"{name}: inputs changed since {done} was written, training again")
    ckpt_path = work / f"{name}-ckpt.pt"
    if ckpt_path.exists() and key is not None:
        state = torch.load(ckpt_path, weights_only=False)
        if state.get("key", key) != key:
            print(f"{name}: {ckpt_path} was trained on other inputs, starting over")
            ckpt_path.unlink()
    digest = (key or {}).get("data", "")  # rounds on the same data share one tokenized copy
    data = tokenize_all(tokenizer, records, work / (f"tokens-{digest}.pt" if digest else f"{name}-tokens.pt"), digest)
    model = make_model(tokenizer, seed)
    if init is not None:
        import transformers

        start = transformers.AutoModelForCausalLM.from_pretrained(str(init), dtype=torch.float32)
        model.load_state_dict(start.state_dict())
        print(f"{name}: starting from {init}")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8)

    def lr_at(step):
        if step < WARMUP:
            return lr * (step + 1) / WARMUP
        t = (step - WARMUP) / max(1, steps - WARMUP)
        return lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))

    step, elapsed = 0, 0.0
    if ckpt_path.exists():
        state = torch.load(ckpt_path, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step, elapsed = state["step"], state["elapsed"]
        print(f"{name}: resuming at step {step}/{steps}")
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{name}: Qwen3, {n_params / 1e6:.2f}M parameters, {len(data)} sequences, {steps} steps of {batch}, lr {lr}")
    model.train()
    loss_of = training_loss(model, compile_)
    plan = Batches(data, seed, batch)
    bar = tqdm(total=steps, initial=step, desc=name, unit="step", dynamic_ncols=True, mininterval=30)
    ema = None
    t0 = time.time() - elapsed
    while step < steps:
        ids, labels, mask = collate(data, plan[step], pad)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        loss = loss_of(ids, labels, mask)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        bar.set_postfix(loss=f"{ema:.4f}", lr=f"{lr_at(step - 1):.1e}", tok=int(mask.sum()))
        bar.update(1)
        if step % 200 == 0 or step == steps:
            save_whole({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
                        "elapsed": time.time() - t0, "key": key}, ckpt_path)
    bar.close()
    stats = {"steps": steps, "train_seconds": round(time.time() - t0, 1), "final_loss": round(ema or 0.0, 4),
             "parameters": n_params, "batch": batch, "lr": lr, "init": str(init) if init else None, "key": key}
    save(model, tokenizer, out)
    done.write_text(json.dumps(stats))
    return stats


def save(model, tokenizer, out: Path) -> None:
    """float16 safetensors (the engines compute in float32 on CPU), tokenizer, generation config."""
    import torch
    import transformers

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model = model.to(torch.float16)
    model.config.dtype = "float16"
    gen = transformers.GenerationConfig(
        eos_token_id=[tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")],
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"), do_sample=False)
    model.generation_config = gen
    model.save_pretrained(str(out), safe_serialization=True)
    gen.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    model.to(torch.float32)
