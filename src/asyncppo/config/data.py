"""The `data` config section: where the prompts come from and how rows are read."""

from pydantic import Field, PositiveInt

from asyncppo.config.base import Section


class DataConfig(Section):
    """Training and validation prompts."""

    train_path: str
    """JSONL file or local Hugging Face `datasets` directory of training rows."""
    validation_path: str | None = None
    """Validation rows; null = split validation_fraction off the training rows."""
    validation_fraction: float = Field(default=0.0, ge=0, lt=1)
    """Share of training rows held out for validation when validation_path is null."""
    prompt_key: str = "prompt"
    """Row field holding a plain-text prompt (used when the row has no messages_key)."""
    messages_key: str = "messages"
    """Row field holding a chat message list."""
    system_prompt: str | None = None
    """System message prepended to plain-text prompts."""
    max_input_seq_length: PositiveInt | None = None
    """A rendered prompt longer than this many tokens is an error naming the row; null = the room left by
    model.max_total_sequence_length - generation.max_new_tokens."""
    shuffle: bool = True
    """Shuffle training rows each epoch (seeded by ppo.seed)."""
    max_new_tokens_key: str | None = None
    """Row field holding each row's response token budget: one int for every sample of the row, or a list of one
    int per sample (ppo.num_generations_per_prompt long for training rows, ppo.val_num_generations_per_prompt for
    validation rows). A sample generates at most min(its budget, generation.max_new_tokens) tokens; every row
    must have the field (a missing or malformed one is an error naming the row). The field stays in the row the
    reward function sees. Reward-function (single-turn) rollouts only: gym runs refuse it. null = every sample
    gets generation.max_new_tokens."""
