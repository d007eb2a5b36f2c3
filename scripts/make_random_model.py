"""Write a random-weight causal LM of a known shape (with the project's local tokenizer) for GPU smoke runs.

    python scripts/make_random_model.py --shape qwen2.5-0.5b --out /tmp/qwen-0.5b-random [--dtype bfloat16]

No hub access: the architecture is built from its published dimensions; token ids of the local tokenizer
(a few hundred) are a subset of the model's vocabulary, so prompts and generations are valid.
"""

import argparse
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from asyncppo.models.tiny import build_tiny_tokenizer

SHAPES = {
    # Published dimensions of Qwen2.5-0.5B and -1.5B.
    "qwen2.5-0.5b": {
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
    },
    "qwen2.5-1.5b": {
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
    },
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    tokenizer = build_tiny_tokenizer(300)
    config = Qwen2Config(
        vocab_size=151936,
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        **SHAPES[args.shape],
    )
    torch.manual_seed(args.seed)
    model = Qwen2ForCausalLM(config).to(getattr(torch, args.dtype))
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    print(f"{args.shape}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters -> {args.out}")


if __name__ == "__main__":
    main()
