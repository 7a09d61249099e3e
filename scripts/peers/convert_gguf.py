"""llama.cpp's convert_hf_to_gguf.py with one change: a pre-tokenizer it does not know is written as qwen2.

    python scripts/peers/convert_gguf.py LLAMA_CPP_SRC [convert_hf_to_gguf.py's arguments...]

The converter names a BPE pre-tokenizer by hashing how the tokenizer splits a test string, and stops on a
hash it has no entry for, as it does for the demo target's small tokenizer. benchmarks/peers.py feeds every
peer token ids, never text, so the pre-tokenizer only matters to llama.cpp's own tokenizing, which the
benchmark does not use; qwen2 is the split the Qwen3 family uses.
"""

from __future__ import annotations

import sys


def main() -> None:
    source = sys.argv[1]
    sys.path.insert(0, source)
    sys.argv = [f"{source}/convert_hf_to_gguf.py", *sys.argv[2:]]
    import convert_hf_to_gguf
    from conversion.base import TextModel

    known = TextModel.get_vocab_base_pre

    def vocab_base_pre(self, tokenizer) -> str:
        try:
            return known(self, tokenizer)
        except NotImplementedError:
            return "qwen2"

    TextModel.get_vocab_base_pre = vocab_base_pre
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main()
