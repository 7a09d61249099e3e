"""A tiny gpt-oss pair that speaks harmony: the tiny gpt_oss target (tests/tiny.py) with a small byte-level
BPE carrying gpt-oss's special tokens, the published chat template, and the published stop ids.

`fixtures/gpt-oss/chat_template.jinja` is the template of openai/gpt-oss-20b as published on the Hugging Face
hub (revision of 2025-08-08, "Update chat_template.jinja (#94)"; Apache-2.0), vendored unchanged from a
public mirror of that repository: the tests render the real template, `strftime_now` and all.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests import tiny

TEMPLATE = Path(__file__).parent / "fixtures" / "gpt-oss" / "chat_template.jinja"
# gpt-oss's special tokens (its reserved ones left out), and the mask the tiny drafts read
SPECIALS = ["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>", "<|start|>", "<|end|>",
            "<|message|>", "<|call|>", "<|endofprompt|>", "<|mask|>"]
CORPUS = [
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI. Knowledge cutoff: "
    "2024-06 Current date: Reasoning: low medium high # Valid channels: analysis, commentary, final. Channel must "
    "be included for every message. Calls to these tools must go to the commentary channel: 'functions'.",
    "assistant user developer functions to=functions.get_weather commentary json {\"city\": \"Paris\"} type = (_: "
    "{ string, number }) => any; namespace // Instructions Tools",
    "What is 48 + 75? Let me think: 8 + 5 = 13, write 3 carry 1; 4 + 7 + 1 = 12. So 123. The weather is sunny.",
]


def make_tokenizer(out: Path):
    """The harmony tokenizer: gpt-oss's special tokens (all flagged special, as published), eos `<|return|>`."""
    from transformers import PreTrainedTokenizerFast

    tok = tiny.byte_level_bpe(SPECIALS, CORPUS)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|startoftext|>", eos_token="<|return|>",
                                   pad_token="<|endoftext|>")
    fast.chat_template = TEMPLATE.read_text()
    fast.save_pretrained(str(out))
    return fast


def make_pair(root: Path) -> tuple[Path, Path]:
    """(target, draft): the tiny gpt_oss target speaking harmony, and a random draft on it."""
    target = tiny.make_target(Path(root) / "target", "gpt_oss")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        (target / name).unlink(missing_ok=True)
    tok = make_tokenizer(target)
    ids = tok.convert_tokens_to_ids
    # the published generation_config: <|return|>, <|endoftext|> and <|call|> end a reply
    (target / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": ids("<|startoftext|>"), "eos_token_id": [ids("<|return|>"), ids("<|endoftext|>"), ids("<|call|>")],
         "pad_token_id": ids("<|endoftext|>"), "do_sample": False}))
    draft = tiny.make_draft(Path(root) / "draft", target, [0, 2])
    return target, draft
