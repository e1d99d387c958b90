"""The GPT-2 port: models.load("gpt2-xl") or models.load("path/to/checkpoint_dir")."""
from models.gpt2 import GPT2, GPT2Config, CONFIGS, EOT, CheckpointError, load, tokenizer

__all__ = ["GPT2", "GPT2Config", "CONFIGS", "EOT", "CheckpointError", "load", "tokenizer"]
