"""Model FLOPs of a decoder's passes, from its Hugging Face config: the one formula behind the `perf/*` metrics.

Called by `trainer/perf.py` (the per-step throughput metrics) and `scripts/policy_mfu.py`. Letters: N the matmul
parameters one token passes through, L a sequence's real tokens, A = num_heads x head_dim the attention width.

    N          = num_layers x (q + k + v + o + 3 x hidden x intermediate) + head
                 q = o = hidden x A,  k = v = hidden x num_kv_heads x head_dim (gated MLP: gate, up, down)
                 head = vocab x hidden (the policy's LM head, a matmul also when tied) or hidden x 1 (the critic)
    forward    = 2 N L + num_layers x 2 x 2 x A x L (L + 1) / 2   (QK^T and AV over the causal triangle)
    training   = 3 x forward (the backward pass costs two forwards)
    scoring    = forward;  generating a sample = forward of prompt + response (prefill and decode compute the
                 same products, one position at a time)

The embedding lookup is no matmul and is not counted; nor are norms, biases, rotary embeddings and softmax (a few
FLOPs per element against thousands per token in the matmuls). Activation recomputation is not counted either: this
is model FLOPs, the work the model needs, not what the hardware did.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from transformers import PretrainedConfig

Head = Literal["policy", "critic"]
"""The output head: the policy's LM head (vocab x hidden) or the critic's scalar value head (hidden x 1)."""
TRAINING_FORWARDS = 3
"""A training pass (forward + backward) costs this many forward passes."""
REQUIRED_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


@dataclass(frozen=True)
class DecoderShape:
    """The sizes of a decoder that its FLOPs depend on."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool

    @classmethod
    def from_config(cls, config: PretrainedConfig) -> "DecoderShape":
        """From a Hugging Face config (a multimodal one's text config): head_dim when stated, else hidden / heads;
        num_key_value_heads when stated, else one KV head per attention head. ValueError naming the fields a
        config without this shape (no gated-MLP decoder) lacks."""
        text = config.get_text_config()
        missing = [name for name in REQUIRED_FIELDS if getattr(text, name, None) is None]
        if missing:
            raise ValueError(f"{type(config).__name__} has no {', '.join(missing)}: not a decoder shape we count")
        heads = int(text.num_attention_heads)
        head_dim = getattr(text, "head_dim", None)
        kv_heads = getattr(text, "num_key_value_heads", None)
        return cls(
            hidden_size=int(text.hidden_size),
            intermediate_size=int(text.intermediate_size),
            num_layers=int(text.num_hidden_layers),
            num_heads=heads,
            num_kv_heads=int(kv_heads) if kv_heads else heads,
            head_dim=int(head_dim) if head_dim else int(text.hidden_size) // heads,
            vocab_size=int(text.vocab_size),
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        )

    @property
    def attention_width(self) -> int:
        """A = num_heads x head_dim: the width of the queries and of the attention output."""
        return self.num_heads * self.head_dim

    @property
    def layer_parameters(self) -> int:
        """Matmul weights of one layer: q, k, v, o projections and the gated MLP."""
        query_and_output = 2 * self.hidden_size * self.attention_width
        keys_and_values = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        return query_and_output + keys_and_values + 3 * self.hidden_size * self.intermediate_size

    @property
    def non_embedding_parameters(self) -> int:
        """Matmul weights of every layer (the count model cards call non-embedding, less norms and biases)."""
        return self.num_layers * self.layer_parameters

    @property
    def total_parameters(self) -> int:
        """Non-embedding weights plus the embedding, and the LM head when it is not tied to the embedding."""
        embedding = self.vocab_size * self.hidden_size
        return self.non_embedding_parameters + embedding * (1 if self.tie_word_embeddings else 2)


@dataclass(frozen=True)
class FlopCounter:
    """Forward and training FLOPs of one model (a decoder and its head) over sequences of given lengths."""

    matmul_parameters: int
    """N: every matmul weight one token passes through, the head included."""
    num_layers: int
    attention_width: int

    @classmethod
    def for_model(cls, shape: DecoderShape, head: Head) -> "FlopCounter":
        head_parameters = shape.vocab_size * shape.hidden_size if head == "policy" else shape.hidden_size
        return cls(shape.non_embedding_parameters + head_parameters, shape.num_layers, shape.attention_width)

    def forward(self, sequence_lengths: Iterable[int]) -> int:
        """2 N L + num_layers x 4 A x L (L + 1) / 2, summed over the sequences (exact integers)."""
        total = 0
        for length in sequence_lengths:
            causal_pairs = length * (length + 1) // 2  # query-key pairs of the causal lower triangle
            total += 2 * self.matmul_parameters * length + self.num_layers * 4 * self.attention_width * causal_pairs
        return total

    def training(self, sequence_lengths: Iterable[int]) -> int:
        """One training pass (forward and backward) over the sequences: 3 x forward."""
        return TRAINING_FORWARDS * self.forward(sequence_lengths)
