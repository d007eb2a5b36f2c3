"""Model shapes that tests in several folders count or build: the SMALL decoder whose FLOPs tests/models/test_flops.py
derives by hand (tests/trainer/test_perf.py reuses its numbers), and Qwen2.5-0.5B's shape (its model card's)."""

from typing import Any

from asyncppo.models.flops import DecoderShape

# hidden 4, intermediate 8, 2 layers, 2 heads of width 2 (A = 4), 1 KV head, vocab 10: N = 328 for the policy,
# 292 for the critic (tests/models/test_flops.py derives both).
SMALL = DecoderShape(
    hidden_size=4,
    intermediate_size=8,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=2,
    vocab_size=10,
    tie_word_embeddings=False,
)

QWEN2_5_0_5B: dict[str, Any] = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,  # of width 64
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
}
"""Qwen2Config keyword arguments of Qwen2.5-0.5B's shape (no weights; rope settings left at the defaults)."""
