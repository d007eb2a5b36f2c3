"""Config sections for the trained models: the policy (`model`), the critic (`value`) and their optimizers."""

import re
import string
from typing import Annotated, Literal, Self

from pydantic import Field, NonNegativeInt, PositiveInt, model_validator

from asyncppo.config.base import RuleError, Section

Precision = Literal["float32", "bfloat16", "float16"]
AdamBeta = Annotated[float, Field(ge=0, lt=1)]


class OptimizerConfig(Section):
    """AdamW settings."""

    lr: float = Field(default=1e-5, gt=0)
    """Peak learning rate."""
    weight_decay: float = Field(default=0.0, ge=0)
    """Decoupled weight decay."""
    betas: tuple[AdamBeta, AdamBeta] = (0.9, 0.999)
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
    """Tokenizer directory or Hugging Face Hub id; null = the model's."""
    revision: str | None = None
    """Git revision (branch, tag or commit hash) of a Hub model id in model_name, and of a Hub tokenizer id;
    null = the default branch. Ignored for local directories and built models (tiny:, demo:)."""
    precision: Precision = "float32"
    """Parameter and compute dtype of the training workers."""
    train_global_batch_size: PositiveInt | None = None
    """Samples per optimizer step; null = the whole step batch (one optimizer step per pass)."""
    train_micro_batch_size: PositiveInt
    """Samples per forward/backward micro-batch (gradients accumulate up to the global batch)."""
    max_tokens_per_microbatch: PositiveInt | None = None
    """Token budget per micro-batch; when set, micro-batches are cut by tokens instead of by count: real tokens
    with sequence_packing, rows x longest row without."""
    sequence_packing: bool | Literal["auto"] = "auto"
    """Run each micro-batch's sequences back to back as one packed row: no padding reaches the model, attention
    stays within each sequence and positions restart per sequence (FlashAttention varlen kernels). `auto` = on
    CUDA devices (on CPU the padded layout is faster: there is no varlen kernel, attention runs per sequence);
    true = on every device; false = the padded layout (rows x longest row), kept for comparison."""
    logprob_batch_size: PositiveInt | None = None
    """Samples per forward pass when scoring without gradients; null = train_micro_batch_size."""
    max_total_sequence_length: PositiveInt = 2048
    """Longest prompt + response, in tokens. The policy's bounds the prompt budget (this - generation.max_new_tokens)
    and the generation engines' contexts; the critic's must be at least the policy's (it scores the same
    sequences, which the privileged critic lengthens by its reserve)."""
    max_grad_norm: float | None = Field(default=1.0, gt=0)
    """Gradient clipping by global norm; null disables clipping."""
    activation_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    compile: bool | Literal["auto"] = "auto"
    """Compile each decoder layer with torch.compile (inductor) for the training and scoring forwards, so the
    element-wise work between the matmuls (norms, rotary embeddings, activations, casts) runs fused; the packed
    attention stays the FlashAttention varlen kernel and the output head the fused chunked one. Shapes are dynamic:
    micro-batches of new token counts reuse the compiled code, and the first step pays the compile (cached on disk
    in TORCHINDUCTOR_CACHE_DIR). Generation with a KV cache on the same model stays eager. `auto` = on CUDA
    devices (on CPU compiling costs more than it saves); true = on every device; false = eager."""
    optimizer: OptimizerConfig = OptimizerConfig()
    """AdamW settings."""
    scheduler: SchedulerConfig = SchedulerConfig()
    """Learning-rate schedule."""


class PolicyModelConfig(TrainedModelConfig):
    """The policy: a Hugging Face causal LM."""

    # Narrowing the shared field to required keeps model_name first in dumps; pydantic supports it.
    model_name: str  # pyright: ignore[reportIncompatibleVariableOverride, reportGeneralTypeIssues]
    """Hugging Face causal LM: a Hub id (`Qwen/Qwen2.5-0.5B`, read from the Hugging Face cache, downloaded into
    it unless HF_HUB_OFFLINE=1), a local model directory, or `tiny:<preset>` (`tiny:tiny`, `tiny:medium`) for a
    random model built locally and cached in $ASYNCPPO_CACHE_DIR (default ~/.cache/asyncppo)."""
    logprob_chunk_size: PositiveInt = 1024
    """Token positions per chunk when computing log-probabilities, so the full fp32 logits never exist at once."""


_TITLE = re.compile(r"[A-Za-z0-9_.-]+")


class PrivilegedFieldConfig(Section):
    """One task field shown to the privileged critic."""

    name: str = Field(min_length=1)
    """Key of the row's task fields (`Trajectory.task`), or a dotted path into nested dicts
    (`metadata.gold`); lists render one item per line, dicts as JSON."""
    title: str | None = None
    """Tag of the field in the reference block (`<title>...</title>`) and suffix of its metric
    privilege/frac_truncated_<title>; null = name."""
    max_tokens: PositiveInt | None = None
    """Cap on this field's tokens (its truncation marker included); null = only the total budget limits it."""

    @property
    def resolved_title(self) -> str:
        """title, or name when title is null."""
        return self.title if self.title is not None else self.name


PRIVILEGE_PLACEHOLDER = "answer"
"""The field of value.privileged_critic.template that receives the reference block: `{answer}`."""


class PrivilegedCriticConfig(Section):
    """Asymmetric actor-critic: the critic (never the policy) reads a reference block built from the row's task
    fields, inserted into its copy of the prompt where `placement` says."""

    enabled: bool = False
    """Insert the reference block into every critic sequence."""
    placement: Literal["user_suffix", "user_prefix", "system"] = "user_suffix"
    """Where the critic's copy of the prompt gets the note (template with the block): `user_suffix` at the end of
    the prompt's last user message, `user_prefix` at its start (each separated from the user's text by a blank
    line), `system` as a leading system message of its own (also where a prompt without a user message gets it)."""
    template: str = "{answer}"
    """Text of the note, a format string whose `{answer}` receives the reference block (`{{`/`}}` for literal
    braces), e.g. `[Reference for the grader only]\n{answer}`."""
    fields: list[PrivilegedFieldConfig] = Field(default_factory=list[PrivilegedFieldConfig])
    """Task fields in priority order, each `{name, title, max_tokens}`: the token budget is spent in this order,
    and blocks list them in it."""
    max_total_tokens: PositiveInt = 512
    """Token budget of the fields' text (truncation markers included) per block; tags and template are extra."""
    template_margin_tokens: NonNegativeInt = 128
    """Tokens reserved beyond max_total_tokens for the chat template, tags and omission markers; the value
    workers' token budget (max_tokens_per_microbatch) is raised by max_total_tokens + this when enabled."""

    @model_validator(mode="after")
    def _check_fields(self) -> Self:
        try:
            names = [name for _, name, _, _ in string.Formatter().parse(self.template) if name is not None]
        except ValueError as error:
            raise RuleError("template", f"{self.template!r} is not a format string ({error})") from None
        if names != [PRIVILEGE_PLACEHOLDER]:
            raise RuleError(
                "template",
                f"{self.template!r} must contain the placeholder {{{PRIVILEGE_PLACEHOLDER}}} exactly once and no "
                f"other field (found {names}); write literal braces as {{{{ and }}}}",
            )
        if self.enabled and not self.fields:
            raise RuleError("fields", "must list at least one task field when enabled is true")
        for key, values in (
            ("name", [field.name for field in self.fields]),
            ("title", [field.resolved_title for field in self.fields]),
        ):
            duplicates = sorted({value for value in values if values.count(value) > 1})
            if duplicates:
                raise RuleError("fields", f"duplicate {key} {duplicates}: each field needs its own {key}")
        for index, field in enumerate(self.fields):
            if not _TITLE.fullmatch(field.resolved_title):
                raise RuleError(
                    f"fields.{index}.title",
                    f"{field.resolved_title!r} is not a tag name (letters, digits, '_', '.', '-'); set a title",
                )
        return self

    @property
    def reserved_tokens(self) -> int:
        """Tokens a block may add to a critic sequence: max_total_tokens + template_margin_tokens (0 when off)."""
        return self.max_total_tokens + self.template_margin_tokens if self.enabled else 0


class ValueModelConfig(TrainedModelConfig):
    """The critic: backbone + scalar head, right-shifted (values[t] = V(state before token t))."""

    model_name: str | None = None
    """Causal LM directory (fresh zero head) or a saved value model; null = the policy's model_name."""
    tokenizer: str | None = None
    """Must be null: the critic scores the policy's token ids, so it uses the policy's tokenizer (model.tokenizer)."""
    warm_start_path: str | None = None
    """A saved value model (e.g. a `value/` checkpoint directory) whose weights start a fresh run, with a fresh
    optimizer and schedule; ignored when resuming from a checkpoint."""
    privileged_critic: PrivilegedCriticConfig = PrivilegedCriticConfig()
    """A reference block from the row's task fields that only the critic reads (asymmetric actor-critic)."""
    own_devices: bool = False
    """Give the critic's data-parallel ranks devices of their own instead of sharing the policy's (then the trainer
    devices split evenly between the two)."""

    @model_validator(mode="after")
    def _check_tokenizer(self) -> Self:
        # The shared field stays in the schema so a value section may mirror the policy's keys; a set value
        # would be silently ignored, since the workers load the one tokenizer the trajectories were made with.
        if self.tokenizer is not None:
            raise RuleError(
                "tokenizer",
                f"{self.tokenizer!r} is not supported: the critic scores the policy's token ids with the policy's "
                "tokenizer (model.tokenizer); remove value.tokenizer",
            )
        return self

    @property
    def critic_max_total_sequence_length(self) -> int:
        """max_total_sequence_length raised by privileged_critic.reserved_tokens (only ever raised)."""
        return self.max_total_sequence_length + self.privileged_critic.reserved_tokens

    @property
    def critic_max_tokens_per_microbatch(self) -> int | None:
        """max_tokens_per_microbatch raised by privileged_critic.reserved_tokens (null stays null)."""
        if self.max_tokens_per_microbatch is None:
            return None
        return self.max_tokens_per_microbatch + self.privileged_critic.reserved_tokens
