"""Training data: conversations read from JSONL, the held-out split, and (prompt, response) samples."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from dflash_tui.engines.errors import UserError, parse_json
from dflash_tui.engines.prompting import chat_ids


@dataclass
class Conversation:
    messages: list[dict]
    thinking: bool
    line: int
    raw: str  # the JSONL line, for the response cache key


@dataclass
class Sample:
    prompt: list[int]
    response: list[int]

    @property
    def ids(self) -> list[int]:
        return self.prompt + self.response


def _bad(path: Path, line: int, what: str) -> UserError:
    return UserError(f"{path}:{line}: {what}; each line must be a JSON object with \"turns\" (alternating user/assistant "
                     "texts, user first) or \"messages\" (role/content objects).")


def load_conversations(path: str) -> list[Conversation]:
    """Every conversation of a JSONL file; a malformed line is a UserError naming file:line."""
    file = Path(path).expanduser()
    if not file.exists():
        raise UserError(f"The data file {path} does not exist; pass a JSONL file of conversations with --data.")
    if not file.is_file():  # a FIFO would block the read, a device never end it
        raise UserError(f"The data file {path} is not a regular file (a folder, a pipe or a device); pass a JSONL "
                        "file of conversations with --data.")
    out: list[Conversation] = []
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"The data file {path} cannot be read ({exc}); pass a UTF-8 JSONL file.") from None
    for n, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            record = parse_json(text)
        except ValueError as exc:
            raise _bad(file, n, f"not valid JSON ({exc})") from None
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


def split(conversations: list[Conversation], held_out: int | None, seed: int) -> tuple[list[Conversation], list[Conversation]]:
    """(train, held out): a seeded shuffle; the held-out slice is the last few (default 5%, at most 16)."""
    n = len(conversations)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    n_val = held_out if held_out is not None else min(16, max(1, n // 20))
    n_val = min(n_val, n - 1) if n > 1 else 0
    train = [conversations[i] for i in order[: n - n_val]]
    held = [conversations[i] for i in order[n - n_val:]] if n_val else list(train)
    return train, held


def first_prompts(tokenizer, conversations: list[Conversation], max_len: int) -> list[list[int]]:
    """Each conversation's prompt up to its first assistant turn (the validation prompts)."""
    prompts = []
    for conv in conversations:
        first = next((i for i, m in enumerate(conv.messages) if m["role"] == "assistant"), len(conv.messages))
        ids = chat_ids(tokenizer, conv.messages[:first], conv.thinking)
        if len(ids) < max_len:
            prompts.append(ids)
    return prompts


def _template(tokenizer, messages: list[dict], thinking: bool) -> list[int]:
    """The chat template's ids for a finished conversation (no generation prompt)."""
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=False, tokenize=True,
                                        enable_thinking=thinking, return_dict=False)
    if isinstance(out, dict) or hasattr(out, "keys"):
        out = out["input_ids"]
    return list(out)


def given_response_ids(tokenizer, history: list[dict], content: str, thinking: bool, eos: list[int]) -> list[int]:
    """The ids the target would write for `content` after `history`: the chat template's rendering of the
    assistant turn up to and including its end-of-turn token."""
    prompt = chat_ids(tokenizer, history, thinking)
    full = _template(tokenizer, history + [{"role": "assistant", "content": content}], thinking)
    if full[: len(prompt)] == prompt and len(full) > len(prompt):
        ids = full[len(prompt):]
        end = next((i for i, t in enumerate(ids) if t in eos), None)
        ids = ids[: end + 1] if end is not None else ids
        # A template that drops the thinking of assistant turns in the history (Qwen3's, the demo's) renders
        # only the answer: the target would have written the whole content, trace included.
        if tokenizer.decode(ids[:end] if end is not None else ids).strip() == content.strip():
            return ids
    # The template renders the turn otherwise (or not at all): tokenize the text itself.
    return tokenizer.encode(content, add_special_tokens=False) + eos[:1]


def fit(samples: list[Sample], max_len: int, data: str) -> list[Sample]:
    """Samples cut to `max_len` tokens; those leaving no room for a response are dropped."""
    out = []
    for s in samples:
        keep = max_len - len(s.prompt)
        if keep >= 2 and s.response:
            out.append(Sample(s.prompt, s.response[:keep]))
    if not out:
        raise UserError(f"No conversation of {data} leaves room for a response within --max-len "
                        f"{max_len}; raise --max-len or shorten the prompts.")
    return out
