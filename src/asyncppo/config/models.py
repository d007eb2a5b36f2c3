"""Config sections for the trained models: the policy (`model`), the critic (`value`) and their optimizers."""

from typing import Literal

from pydantic import Field, PositiveInt

from asyncppo.config.base import Section

Precision = Literal["float32", "bfloat16", "float16"]


class OptimizerConfig(Section):
    """AdamW settings."""

    lr: float = Field(default=1e-5, gt=0)
    """Peak learning rate."""
    weight_decay: float = Field(default=0.0, ge=0)
    """Decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam beta1, beta2."""
    eps: float = Field(default=1e-8, gt=0)
    """Adam epsilon."""


class SchedulerConfig(Section):
    """Learning-rate schedule; it ticks once per optimizer step."""

    name: Literal["constant", "linear", "cosine"] = "constant"
    """Shape after warmup: constant, linear decay to min_lr_ratio, or cosine decay to min_lr_ratio."""
    warmup_steps: int = Field(default=0, ge=0)
    """Optimizer steps of linear warmup from 0 to the peak learning rate."""
    total_steps: PositiveInt | None = None
    """Optimizer steps over which linear/cosine decay runs; null = derived from ppo.max_num_steps and the epochs."""
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1)
    """Final learning rate as a fraction of the peak (linear and cosine)."""


class TrainedModelConfig(Section):
    """Fields shared by the policy and the value model."""

    model_name: str | None = None
    """Model directory (each subclass documents its own meaning)."""
    tokenizer: str | None = None
    """Tokenizer directory; null = the model directory."""
    precision: Precision = "float32"
    """Parameter and compute dtype of the training workers."""
    train_global_batch_size: PositiveInt | None = None
    """Samples per optimizer step; null = the whole step batch (one optimizer step per pass)."""
    train_micro_batch_size: PositiveInt
    """Samples per forward/backward micro-batch (gradients accumulate up to the global batch)."""
    max_tokens_per_microbatch: PositiveInt | None = None
    """Token budget per micro-batch; when set, micro-batches are packed by tokens instead of by count."""
    logprob_batch_size: PositiveInt | None = None
    """Samples per forward pass when scoring without gradients; null = train_micro_batch_size."""
    max_total_sequence_length: PositiveInt = 2048
    """Longest prompt + response, in tokens, the workers accept."""
    max_grad_norm: float | None = Field(default=1.0, gt=0)
    """Gradient clipping by global norm; null disables clipping."""
    activation_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    optimizer: OptimizerConfig = OptimizerConfig()
    """AdamW settings."""
    scheduler: SchedulerConfig = SchedulerConfig()
    """Learning-rate schedule."""


class PolicyModelConfig(TrainedModelConfig):
    """The policy: a Hugging Face causal LM."""

    # Narrowing the shared field to required keeps model_name first in dumps; pydantic supports it.
    model_name: str  # pyright: ignore[reportIncompatibleVariableOverride, reportGeneralTypeIssues]
    """Local Hugging Face causal LM directory, or `tiny:<preset>` (`tiny:tiny`, `tiny:medium`) for a random
    model built locally and cached in $ASYNCPPO_CACHE_DIR (default ~/.cache/asyncppo)."""
    logprob_chunk_size: PositiveInt = 1024
    """Token positions per chunk when computing log-probabilities, so the full fp32 logits never exist at once."""


class ValueModelConfig(TrainedModelConfig):
    """The critic: backbone + scalar head, right-shifted (values[t] = V(state before token t))."""

    model_name: str | None = None
    """Causal LM directory (fresh zero head) or a saved value model; null = the policy's model_name."""
    warm_start_path: str | None = None
    """A saved value model (e.g. a `value/` checkpoint directory) whose weights start a fresh run, with a fresh
    optimizer and schedule; ignored when resuming from a checkpoint."""
