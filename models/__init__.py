"""The GPT-2 port: models.load("gpt2-xl") or models.load("path/to/checkpoint_dir", dtype="float16")."""
from models.gpt2 import GPT2, GPT2Config, CONFIGS, DTYPES, EOT, CheckpointError, check_device, device_tokens, load, resolve_dtype, tokenizer, vocab_width

__all__ = ["GPT2", "GPT2Config", "CONFIGS", "DTYPES", "EOT", "CheckpointError", "check_device", "device_tokens", "load", "resolve_dtype", "tokenizer", "vocab_width"]
