"""The built-in prompt sets (JSONL, one sample per line), named by their file names."""

import importlib.resources

NAMES = tuple(sorted(p.name.removesuffix(".jsonl") for p in importlib.resources.files(__name__).iterdir()
                     if p.name.endswith(".jsonl")))
