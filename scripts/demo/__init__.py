"""Stages of `make demo-models`: corpus, tokenizer, target, evaluation, draft (see scripts/make_demo_models.py)."""
