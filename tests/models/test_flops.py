"""The FLOP formula of `models/flops.py`: parameter counts and forward / training FLOPs, every number derived by hand
in a comment, and the Qwen2.5-0.5B shape against its model card (0.49B parameters, 0.36B non-embedding)."""

import pytest
from transformers import LlamaConfig, Qwen2Config

from asyncppo.models.flops import DecoderShape, FlopCounter
from model_shapes import QWEN2_5_0_5B, SMALL

# SMALL: hidden 4, intermediate 8, 2 layers, 2 heads of width 2 (A = 4), 1 KV head, vocab 10, untied.
QWEN_0_5B = Qwen2Config(**QWEN2_5_0_5B)


def test_small_shape_parameters():
    # q = o = 4 x 4 = 16 each; k = v = 4 x (1 x 2) = 8 each; MLP 3 x 4 x 8 = 96: a layer is 32 + 16 + 96 = 144.
    assert SMALL.layer_parameters == 144
    assert SMALL.non_embedding_parameters == 288
    # Untied: embedding and LM head, 10 x 4 = 40 each.
    assert SMALL.total_parameters == 288 + 80
    # The policy adds its LM head (40), the critic its scalar head (4 x 1).
    assert FlopCounter.for_model(SMALL, "policy").matmul_parameters == 328
    assert FlopCounter.for_model(SMALL, "critic").matmul_parameters == 292


def test_small_shape_forward_and_training_flops():
    policy = FlopCounter.for_model(SMALL, "policy")
    # L = 3: 2 N L = 2 x 328 x 3 = 1968; attention 2 layers x 4 x A=4 x (3 x 4 / 2 = 6 causal pairs) = 192.
    assert policy.forward([3]) == 1968 + 192
    # L = 1: 2 x 328 = 656; attention 2 x 4 x 4 x 1 = 32. Sequences add up.
    assert policy.forward([1]) == 688
    assert policy.forward([3, 1]) == 2160 + 688
    assert policy.training([3, 1]) == 3 * 2848
    assert policy.forward([]) == 0
    # Critic, L = 3: 2 x 292 x 3 = 1752, the same attention 192.
    assert FlopCounter.for_model(SMALL, "critic").forward([3]) == 1752 + 192


def test_qwen2_5_0_5b_parameters_match_its_model_card():
    shape = DecoderShape.from_config(QWEN_0_5B)
    assert (shape.head_dim, shape.num_kv_heads, shape.tie_word_embeddings) == (64, 2, True)  # 896 / 14 heads
    # A layer: q = o = 896 x 896 = 802,816 each; k = v = 896 x 128 = 114,688 each; MLP 3 x 896 x 4864 = 13,074,432.
    assert shape.layer_parameters == 2 * 802_816 + 2 * 114_688 + 13_074_432 == 14_909_440
    # 24 layers: 357,826,560 (the card's 0.36B non-embedding); tied embedding 151,936 x 896 = 136,134,656 once.
    assert shape.non_embedding_parameters == 357_826_560
    assert shape.total_parameters == 493_961_216
    assert shape.non_embedding_parameters == pytest.approx(0.358e9, rel=0.01)
    assert shape.total_parameters == pytest.approx(0.494e9, rel=0.01)
    # The policy's N counts the (tied) LM head as the matmul it is: N = total parameters here.
    assert FlopCounter.for_model(shape, "policy").matmul_parameters == 493_961_216


def test_qwen2_5_0_5b_forward_of_a_1024_token_sequence():
    policy = FlopCounter.for_model(DecoderShape.from_config(QWEN_0_5B), "policy")
    # 2 N L = 2 x 493,961,216 x 1024 = 1,011,632,570,368;
    # attention 24 layers x 4 x A=896 x (1024 x 1025 / 2 = 524,800) = 45,141,196,800.
    assert policy.forward([1024]) == 1_011_632_570_368 + 45_141_196_800
    assert policy.training([1024]) == 3 * 1_056_773_767_168


def test_an_explicit_head_dim_is_used_over_hidden_over_heads():
    # Qwen3-style: 4 heads of 32 on a 64-wide model (A = 128, not 64).
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        vocab_size=100,
        tie_word_embeddings=False,
    )
    shape = DecoderShape.from_config(config)
    assert (shape.head_dim, shape.attention_width) == (32, 128)
    # q = o = 64 x 128 = 8192 each; k = v = 64 x 64 = 4096 each; MLP 3 x 64 x 128 = 24,576.
    assert shape.layer_parameters == 16_384 + 8_192 + 24_576
