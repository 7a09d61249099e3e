"""A tiny Gemma 4 pair that speaks Gemma 4's chat format: the tiny `gemma4` target (tests/tiny.py) with a small
byte-level BPE carrying Gemma 4's special tokens and named tokens (as google/gemma-4-31B-it's tokenizer_config
names them), the published chat template, and `<turn|>`, `<eos>` and `<|tool_response>` as stop ids (where
transformers' Gemma 4 response parser ends the content).

`fixtures/gemma-4/chat_template.jinja` is the template of google/gemma-4-31B-it as published (2026-07-09; its
README says where the bytes come from): the tests render the real template.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests import tiny

TEMPLATE = Path(__file__).parent / "fixtures" / "gemma-4" / "chat_template.jinja"
# the published tokenizer_config's named tokens (all special there); `<|mask|>` is the tiny drafts' mask
NAMED = {"sot_token": "<|turn>", "eot_token": "<turn|>", "soc_token": "<|channel>", "eoc_token": "<channel|>",
         "think_token": "<|think|>", "std_token": "<|tool>", "etd_token": "<tool|>", "stc_token": "<|tool_call>",
         "etc_token": "<tool_call|>", "str_token": "<|tool_response>", "etr_token": "<tool_response|>",
         "escape_token": '<|"|>', "image_token": "<|image|>", "audio_token": "<|audio|>"}
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", *NAMED.values(), "<|mask|>"]
CORPUS = [
    "system user model thought call: response: declaration: description: parameters: properties: required: "
    "type: STRING OBJECT NUMBER get_weather city days units value true false null { } [ ] , :",
    "What is 48 + 75? Let me think: 8 + 5 = 13, write 3 carry 1; 4 + 7 + 1 = 12. So 123. The weather is sunny.",
    "Paris 18 C, sunny. Look up the weather for a city. And 1 + 1? Thanks.",
]


def make_tokenizer(out: Path):
    """Gemma 4's special tokens, all flagged special as published; eos `<eos>`, and `<turn|>` ending a turn."""
    from transformers import PreTrainedTokenizerFast

    tok = tiny.byte_level_bpe(SPECIALS, CORPUS)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                                   unk_token="<unk>", mask_token="<mask>", extra_special_tokens=NAMED)
    fast.chat_template = TEMPLATE.read_text()
    fast.save_pretrained(str(out))
    return fast


def make_pair(root: Path, weights: Path) -> tuple[Path, Path]:
    """(target, draft): the tiny gemma4 target in `weights` (tests/tiny.py's, built once per session by the
    `pairs` fixture), copied with Gemma 4's tokenizer in place of the tiny one, and a random draft on it."""
    target = Path(root) / "target"
    shutil.copytree(weights, target, ignore=shutil.ignore_patterns(
        "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"))
    tok = make_tokenizer(target)
    ids = tok.convert_tokens_to_ids
    # a reply ends at the end of its turn, at eos, or where a tool call hands over to the tool's response
    (target / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": ids("<bos>"), "eos_token_id": [ids("<eos>"), ids("<turn|>"), ids("<|tool_response>")],
         "pad_token_id": ids("<pad>"), "do_sample": False}))
    draft = tiny.make_draft(Path(root) / "draft", target, [0, 2])
    return target, draft
