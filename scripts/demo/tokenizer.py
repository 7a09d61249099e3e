"""A byte-level BPE tokenizer trained on the demo corpus, with Qwen-style special tokens and chat template.

Digits are split one per token (as Qwen does) so that digit-by-digit arithmetic lines up with tokens.
`<think>` and `</think>` are added tokens that stay visible in decoded text; `<|mask|>` is the DFlash
draft's mask token and never occurs in text.
"""

from __future__ import annotations

from pathlib import Path

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
VISIBLE = ["<think>", "</think>"]
BPE_VOCAB = 768
# GPT-2's split, except that a number is cut into bare single digits: a space before a digit is a token
# of its own, so each digit has exactly one id wherever it stands (copying digits stays a lookup).
SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

# Qwen3-like: an optional system message, user/assistant turns; earlier assistant turns lose their
# think block; enable_thinking=false ends the generation prompt with an empty think block.
# With `tools` (Qwen3's structure, kept compact: this BPE spells JSON almost a character a token): one
# system message holds the system prompt, then each tool's function schema as one JSON line without
# spaces inside <tools></tools> (Qwen3's sentences on the call format are left out: 56 tokens here, and
# the demo target learned the format itself); an assistant message's `tool_calls` follow its text as `<tool_call>\n{"name": ...,
# "arguments": {...}}\n</tool_call>` blocks (arguments given as a JSON string are written as they are);
# consecutive `tool` messages share one user turn, each inside <tool_response></tool_response>. Without
# tools, tool calls or tool messages the output is byte for byte the template the demo target shipped with.
CHAT_TEMPLATE = (
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if messages and messages[0].role == 'system' -%}{{- messages[0].content + '\\n\\n' -}}{%- endif -%}"
    "{{- '# Tools\\n<tools>' -}}"
    "{%- for tool in tools -%}"
    "{{- '\\n' + ((tool.function if tool.function is defined else tool) | tojson(separators=(',', ':'))) -}}"
    "{%- endfor -%}"
    "{{- '\\n</tools><|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if tools and loop.first and m.role == 'system' -%}"
    "{%- elif m.role == 'assistant' -%}"
    "{%- set content = m.content or '' -%}"
    "{%- if '</think>' in content -%}{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}{%- endif -%}"
    "{{- '<|im_start|>assistant\\n' + content -}}"
    "{%- for call in (m.tool_calls or []) -%}"
    "{%- if content or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{%- set f = call.function if call.function is defined else call -%}"
    "{{- '<tool_call>\\n{\"name\": \"' + f.name + '\", \"arguments\": ' -}}"
    "{{- f.arguments if f.arguments is string else (f.arguments | tojson) -}}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif m.role == 'tool' -%}"
    "{%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + (m.content if m.content is string else (m.content | tojson)) + '\\n</tool_response>' -}}"
    "{%- if loop.last or loop.nextitem.role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- else -%}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}"
    "{%- endif -%}"
)


def texts(records):
    for r in records:
        for m in r["messages"]:
            yield m["content"].replace("<think>", "").replace("</think>", "")


def build(out: Path, records: list[dict], corpus_digest: str | None = None):
    """Train, save with save_pretrained under `out` and return the tokenizer. Skipped when `out` holds
    one trained on the same corpus (`corpus_digest`, kept in out/corpus.digest)."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        trainers,
    )
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    out = Path(out)
    stamp = out / "corpus.digest"
    if (out / "tokenizer.json").exists() and (corpus_digest is None or (stamp.exists() and stamp.read_text() == corpus_digest)):
        tok = AutoTokenizer.from_pretrained(str(out))
        if tok.chat_template != CHAT_TEMPLATE:  # built or adopted before the template changed: only the template
            # file is rewritten (tokenizer.json stays byte for byte, so the base phase's key holds)
            (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
            tok = AutoTokenizer.from_pretrained(str(out))
        return tok
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts(records), trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in VISIBLE])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>", "<|mask|>"], model_max_length=2048)
    fast.chat_template = CHAT_TEMPLATE
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    if corpus_digest is not None:
        stamp.write_text(corpus_digest)
    return AutoTokenizer.from_pretrained(str(out))


def ids_of(tokenizer) -> dict:
    return {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIALS + VISIBLE}
