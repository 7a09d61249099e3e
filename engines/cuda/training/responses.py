"""The responses a draft learns from: the data's own (`given`), or the target's, written once and cached.

With `generate` the target writes every assistant turn itself (self-distillation): greedy, one at a
time through the real decoding loop at block size 1, or batched through transformers' `generate`
(`--gen-batch`). Each conversation's responses are appended to `responses.jsonl` under a key of the
target, the length limits, the thinking mode and the data line, so a rerun reuses them.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Callable, Optional

import torch

from dflash_tui.engines import files
from dflash_tui.engines.cuda.loop import Sampler, speculative_decode
from dflash_tui.engines.cuda.training.data import Conversation, Sample, fit, given_response_ids
from dflash_tui.engines.errors import UserError
from dflash_tui.engines.prompting import chat_ids
from dflash_tui.engines.sampling import SamplingParams

RESPONSES_FILE = "responses.jsonl"


class Responses:
    """(prompt, response) samples for conversations, from the data or from the target."""

    def __init__(self, target, tokenizer, eos: list[int], target_path: Path, work: Path, max_len: int,
                 max_new_tokens: Optional[int], gen_batch: int, data: str,
                 progress: Callable[[str, int, int], None]):
        self.target, self.tokenizer, self.eos = target, tokenizer, eos
        self.target_path, self.work, self.data = Path(target_path), work, data
        self.max_len, self.max_new_tokens, self.gen_batch = max_len, max_new_tokens, gen_batch
        self.progress = progress  # (message, done, total)

    def given(self, conversations: list[Conversation]) -> list[Sample]:
        """Every assistant turn of the data, as the chat template renders it."""
        samples = []
        for conv in conversations:
            for i, m in enumerate(conv.messages):
                if m["role"] == "assistant" and i:
                    prompt = chat_ids(self.tokenizer, conv.messages[:i], conv.thinking)
                    response = given_response_ids(self.tokenizer, conv.messages[:i], m["content"], conv.thinking,
                                                  self.eos)
                    samples.append(Sample(prompt, response))
        if not samples:
            raise UserError(f"{self.data} has no assistant turns to train on with --responses given; add them, or "
                            "use --responses generate to let the target write them.")
        return fit(samples, self.max_len, self.data)

    def generated(self, conversations: list[Conversation]) -> list[Sample]:
        """Every user turn answered by the target, reading and extending the cache."""
        cache_file = self.work / RESPONSES_FILE
        if cache_file.resolve() == Path(self.data).expanduser().resolve():  # Trainer refuses this before; never append to it
            raise UserError(f"--data {self.data} is train-draft's responses cache {cache_file}; move the data file "
                            "out of the work folder.")
        cached = self._read_cache(cache_file)
        target_key = self._target_key()
        keys = [hashlib.sha256(f"{target_key}|{self.max_len}|{self.max_new_tokens}|{conv.thinking}|{conv.raw}".encode())
                .hexdigest()[:24] for conv in conversations]
        todo = [(conv, key) for conv, key in zip(conversations, keys) if key not in cached]
        if todo:
            self._write(todo, cached, cache_file)
        samples = []
        for conv, key in zip(conversations, keys):
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
        return fit(samples, self.max_len, self.data)

    @staticmethod
    def _read_cache(cache_file: Path) -> dict[str, list[list[int]]]:
        cached: dict[str, list[list[int]]] = {}
        if cache_file.is_file():
            for text in cache_file.read_text().splitlines():
                try:
                    entry = json.loads(text)
                    cached[entry["key"]] = entry["responses"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue  # a torn last line from an interrupted run
        return cached

    def _write(self, todo: list[tuple[Conversation, str]], cached: dict, cache_file: Path) -> None:
        """The target answers the conversations in `todo`, `gen_batch` at a time, each appended to the cache."""
        total = sum(sum(1 for m in conv.messages if m["role"] == "user") for conv, _ in todo)
        self.work.mkdir(parents=True, exist_ok=True)
        self.progress("target writes responses", 0, total)
        done = 0
        group = max(1, self.gen_batch)
        try:
            if not os.path.lexists(cache_file):  # made fresh, then appended to as train-draft's own file
                files.write_file(cache_file, b"", mode=None, replace=False)
            fd = files.open_own(cache_file, os.O_WRONLY | os.O_APPEND, self.work, what="Response cache")
        except OSError as exc:  # a FIFO nothing reads, a read-only folder
            raise UserError(f"The response cache {cache_file} cannot be written ({exc.strerror or type(exc).__name__}); "
                            "remove what is in its place, or pass another --work-dir.") from None
        with os.fdopen(fd, "w") as fh:
            for g in range(0, len(todo), group):
                chunk = todo[g: g + group]
                talks = [self._dialogue(conv) for conv, _ in chunk]
                responses: list[list[list[int]]] = [[] for _ in chunk]
                prompts = [next(t, None) for t in talks]
                while any(p is not None for p in prompts):
                    live = [i for i, p in enumerate(prompts) if p is not None]
                    written = self._generate([p for p in prompts if p is not None])  # in `live`'s order
                    for i, response in zip(live, written):
                        responses[i].append(response)
                        try:
                            prompts[i] = talks[i].send(response)
                        except StopIteration:
                            prompts[i] = None
                    done += len(live)
                    self.progress("", done, total)
                for (conv, key), written in zip(chunk, responses):
                    cached[key] = written
                    fh.write(json.dumps({"key": key, "line": conv.line, "responses": written}) + "\n")
                fh.flush()

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
            if self.max_len - len(prompt) < 2:
                return
            response = yield prompt
            text = self.tokenizer.decode([t for t in response if t not in self.eos], skip_special_tokens=False)
            history.append({"role": "assistant", "content": text})

    def _max_new(self, prompt: list[int]) -> int:
        room = self.max_len - len(prompt)
        return min(room, self.max_new_tokens or room)

    def _generate(self, prompts: list[list[int]]) -> list[list[int]]:
        """The target's greedy responses, each up to and including its first stop id."""
        device = self.target.device
        if len(prompts) == 1 or self.gen_batch <= 1:
            out = []
            for prompt in prompts:
                ids: list[int] = []
                for step in speculative_decode(self.target, None, prompt, 1, self._max_new(prompt),
                                               Sampler(SamplingParams(), device)):
                    ids += step.emitted
                    if step.emitted[-1] in self.eos:
                        break
                out.append(ids)
            return out
        width = max(len(p) for p in prompts)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        batch = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        with torch.inference_mode():
            out = self.target.model.generate(
                input_ids=batch, attention_mask=mask, max_new_tokens=max(self._max_new(p) for p in prompts),
                do_sample=False, temperature=None, top_p=None, top_k=None, eos_token_id=self.eos or None,
                pad_token_id=pad)
        written = []
        for row, prompt in zip(out[:, width:].tolist(), prompts):
            end = next((i for i, t in enumerate(row) if t in self.eos), None)
            written.append(row[: end + 1 if end is not None else len(row)][: self._max_new(prompt)])
        return written

    def _target_key(self) -> str:
        h = hashlib.sha256((self.target_path / "config.json").read_bytes())
        for f in sorted(self.target_path.glob("*.safetensors")):
            h.update(f"{f.name}:{f.stat().st_size}".encode())
        return h.hexdigest()[:16]
