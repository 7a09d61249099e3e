"""Training a DFlash draft for a target, in PyTorch: `data` (conversations and samples), `responses`
(the target writes them, cached), `objective` (the block loss, all anchors in one pass) and `trainer`
(the run: setup, loop, validation, resumable state)."""

from dflash_tui.engines.cuda.training.data import Conversation, Sample, given_response_ids, load_conversations
from dflash_tui.engines.cuda.training.objective import bf16_autocast_pays, default_gamma
from dflash_tui.engines.cuda.training.trainer import Interrupted, Progress, Result, TrainConfig, Trainer, parse_layer_ids, train_draft

__all__ = ["TrainConfig", "Trainer", "train_draft", "load_conversations", "given_response_ids", "Conversation",
           "Sample", "Progress", "Result", "Interrupted", "default_gamma", "parse_layer_ids", "bf16_autocast_pays"]
