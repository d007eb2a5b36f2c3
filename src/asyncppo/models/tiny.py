"""A tiny random Llama and a locally trained byte-level BPE tokenizer, built with no hub access.

Tests and the CPU demo call `ensure_tiny` (cached build) or `build_tiny_model` /
`build_tiny_tokenizer` (in memory). Load what `save_tiny` wrote with `policy.load_policy` and
`tokenizer.load_tokenizer`.
"""

import hashlib
import json
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from asyncppo.models.build_cache import build_once
from asyncppo.models.chat_template import CHAT_TEMPLATE, IM_END, PAD_TOKEN, SPECIAL_TOKENS


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of a tiny Llama; `seed` fixes its random weights."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    seed: int

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by heads {self.num_attention_heads}")
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError(
                f"num_attention_heads {self.num_attention_heads} is not divisible by "
                f"num_key_value_heads {self.num_key_value_heads}"
            )


TINY = TinyModelSpec(
    num_layers=2,
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    vocab_size=300,
    max_position_embeddings=1024,
    seed=0,
)
MEDIUM = TinyModelSpec(
    num_layers=4,
    hidden_size=256,
    num_attention_heads=8,
    num_key_value_heads=8,
    intermediate_size=1024,
    vocab_size=1000,
    max_position_embeddings=1024,
    seed=0,
)
PRESETS: dict[str, TinyModelSpec] = {"tiny": TINY, "medium": MEDIUM}

# Special tokens come first in the vocabulary (see chat_template.SPECIAL_TOKENS), so their ids are fixed.
PAD_TOKEN_ID = SPECIAL_TOKENS.index(PAD_TOKEN)
EOS_TOKEN_ID = SPECIAL_TOKENS.index(IM_END)
_BYTE_ALPHABET_SIZE = 256

_NAMES = ["Ada", "Ben", "Chen", "Dana", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jo"]
_CITIES = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Delhi", "Quito", "Seoul"]
_NOUNS = ["cat", "dog", "apple", "river", "house", "book", "train", "garden", "number", "answer", "question"]
_VERBS = ["sees", "likes", "finds", "counts", "reads", "paints", "builds", "opens"]
_ADJECTIVES = ["small", "red", "quiet", "bright", "old", "new", "happy", "cold", "warm"]
_SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Please think step by step before you answer.",
    "I will call a tool to look that up.",
    "The weather today is sunny with a light breeze.",
    "Let me check the result again to be sure.",
    "Thank you! Is there anything else I can help with?",
    "Sorry, I could not find that information.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9, and 10, 100, 1000.",
]


def _training_corpus(seed: int = 0, num_lines: int = 1500) -> Iterator[str]:
    """Deterministic chat-like text: arithmetic, short dialogue, JSON tool calls and responses, sentences."""
    rng = random.Random(seed)
    yield from _SENTENCES
    for _ in range(num_lines):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        name, city = rng.choice(_NAMES), rng.choice(_CITIES)
        kind = rng.randrange(5)
        if kind == 0:
            yield f"{a}+{b}={a + b}\n{a}-{b}={a - b}\n{a}*{b % 10}={a * (b % 10)}"
        elif kind == 1:
            yield f"user\nWhat is {a}+{b}?\nassistant\nThe answer is {a + b}."
        elif kind == 2:
            call = {"name": "get_weather", "arguments": {"city": city, "unit": rng.choice(["celsius", "fahrenheit"])}}
            yield json.dumps(call)
            yield json.dumps({"city": city, "temperature": rng.randint(-10, 35), "condition": "sunny"})
        elif kind == 3:
            subject = f"The {rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)}"
            yield f"{subject} {rng.choice(_VERBS)} the {rng.choice(_NOUNS)} in {city}."
        else:
            greeting = f"user\nHello, I am {name}. How are you?\nassistant\nHi {name}! I am fine, thanks."
            yield f"{greeting} {rng.choice(_SENTENCES)}"


def build_tiny_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE with exactly `vocab_size` ids (special tokens first), trained on `_training_corpus`.

    The byte-level initial alphabet makes every string encodable; no normalizer and no post-processor, so
    `decode(encode(text)) == text` and no BOS is added. eos is `<|im_end|>` (a chat turn ends generation).
    """
    minimum = len(SPECIAL_TOKENS) + _BYTE_ALPHABET_SIZE
    if vocab_size < minimum:
        raise ValueError(f"vocab_size {vocab_size} is below the {minimum} ids of special tokens plus bytes")
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    # normalized=False keeps special tokens matched on the raw text; special=True keeps them unsplit.
    special_tokens = [AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_training_corpus(), trainer=trainer)
    if backend.get_vocab_size() != vocab_size:
        raise ValueError(
            f"the training corpus yields {backend.get_vocab_size()} ids, fewer than vocab_size {vocab_size}"
        )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[token for token in SPECIAL_TOKENS if token not in (IM_END, PAD_TOKEN)],
        # The default cleanup rewrites " ." to "." on decode, which would break exact round trips.
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    assert tokenizer.pad_token_id == PAD_TOKEN_ID and tokenizer.eos_token_id == EOS_TOKEN_ID
    assert tokenizer.bos_token_id is None
    return tokenizer


def build_tiny_model(spec: TinyModelSpec) -> LlamaForCausalLM:
    """A randomly initialised Llama of `spec`'s shape; the same spec always gives the same weights."""
    config = LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        # Must match build_tiny_tokenizer: no BOS, eos = <|im_end|>, pad = <|pad|>.
        bos_token_id=None,
        eos_token_id=EOS_TOKEN_ID,
        pad_token_id=PAD_TOKEN_ID,
        # Tied like the small Qwen models, so weight sync and checkpoints meet shared parameters in tests too.
        tie_word_embeddings=True,
        dtype=torch.float32,
    )
    # Weight init draws from the global CPU generator; fork it so building a model leaves the caller's RNG alone.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = LlamaForCausalLM(config)
    return model.eval()


def save_tiny(directory: str | Path, spec: TinyModelSpec) -> Path:
    """Build the model and tokenizer of `spec` and write both (safetensors) into `directory`; returns it."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    build_tiny_model(spec).save_pretrained(directory)
    build_tiny_tokenizer(spec.vocab_size).save_pretrained(directory)
    return directory


# Bump when the tokenizer corpus, the chat template or the build procedure changes, so caches rebuild.
BUILD_VERSION = 1


def build_fingerprint(spec: TinyModelSpec) -> str:
    """Short hash of the spec and BUILD_VERSION: a cached build is reused only if it was built the same way."""
    payload = json.dumps({"spec": asdict(spec), "build_version": BUILD_VERSION}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def ensure_tiny(cache_dir: str | Path, preset_name: str) -> Path:
    """Path of the preset's model directory under `cache_dir`, built on first use and reused after.

    The directory is named `<preset>-<fingerprint>`, so a changed preset or build gets a fresh directory;
    `build_once` makes sure a crash never leaves a half-written model at that path.
    """
    if preset_name not in PRESETS:
        raise ValueError(f"unknown tiny model preset {preset_name!r}; expected one of {sorted(PRESETS)}")
    spec = PRESETS[preset_name]
    final = Path(cache_dir) / f"{preset_name}-{build_fingerprint(spec)}"
    # save_tiny is looked up when the build runs, so tests can make it fail part-way.
    return build_once(final, lambda staging: save_tiny(staging, spec))
