"""Turning a request into prompt ids with the target's own tokenizer and chat template.

transformers is used for the tokenizer only (both engines need it; it pulls in no torch here).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from dflash_tui.engines.config import GenerationRequest
from dflash_tui.engines.errors import UserError, describe


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    try:  # never run a checkpoint's tokenizer code: transformers raises instead of prompting
        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    except Exception as exc:
        raise UserError(f"The tokenizer in {path} cannot be loaded ({describe(exc)}); re-download the target.") from None


def prompt_ids(tokenizer, request: GenerationRequest) -> list[int]:
    given = [x is not None for x in (request.messages, request.prompt, request.prompt_ids)]
    if sum(given) != 1:
        raise UserError("A generation request needs exactly one of messages, prompt or prompt_ids.")
    for text in [request.prompt] + [m.get("content") for m in request.messages or [] if isinstance(m, dict)]:
        check_text(text)
    if request.prompt_ids is not None:
        ids = list(request.prompt_ids)
    elif request.prompt is not None:
        ids = tokenizer.encode(request.prompt, add_special_tokens=False)
    else:
        ids = chat_ids(tokenizer, request.messages, request.thinking)
    if not ids:
        raise UserError("The prompt is empty; type something to send.")
    return ids


def check_text(text) -> None:
    """Text a tokenizer can take: a string of valid Unicode (undecodable input bytes arrive as lone
    surrogates, which no tokenizer encodes)."""
    if text is None:
        return
    if not isinstance(text, str):
        raise UserError(f"A message's content is {type(text).__name__}, not text; send a string.")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UserError(f"The prompt has bytes that are not valid UTF-8 (at character {exc.start}); "
                        "re-type it or fix the file's encoding.") from None


def chat_ids(tokenizer, messages: list[dict], thinking: bool) -> list[int]:
    if not getattr(tokenizer, "chat_template", None):
        raise UserError("The target's tokenizer has no chat template; use --raw to send plain text.")
    out = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, enable_thinking=thinking, return_dict=False
    )
    if isinstance(out, dict) or hasattr(out, "keys"):
        out = out["input_ids"]
    return list(out)


def check_context(prompt_len: int, max_positions: Optional[int]) -> None:
    if max_positions and prompt_len >= max_positions:
        raise UserError(
            f"The prompt is {prompt_len} tokens but the target's context holds {max_positions}; "
            "shorten the prompt or start a new session."
        )
