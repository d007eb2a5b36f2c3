"""Fakes and builders shared by the worker tests (a synthetic ragged batch, default settings, weight snapshots).

A module with its own name (not conftest) so tests and spawned ranks import it unambiguously.
"""

import dataclasses
from typing import Any

import torch

from asyncppo.algorithms.policy_loss import PolicyLossSettings
from asyncppo.algorithms.value_loss import ValueLossSettings
from asyncppo.rollout.batch import TrainBatch
from asyncppo.rollout.trajectory import MessageSpan
from asyncppo.workers.optim import OptimizerSettings, SchedulerSettings
from asyncppo.workers.policy_worker import PolicyWorker, PolicyWorkerSettings
from asyncppo.workers.trained_model import TrainedModelSettings
from asyncppo.workers.value_worker import ValueWorkerSettings

PROMPT_LENGTH = 3


def make_batch(lengths: list[int], seed: int = 0, vocab_size: int = 300) -> TrainBatch:
    """Right-padded rows of the given lengths: PROMPT_LENGTH prompt tokens then response tokens (token_mask 1).

    Advantages are +1 on odd-indexed rows and -1 on even ones; returns alternate 1 / -0.5 by row; old and
    generation logprobs are left for the test to fill (zeros here).
    """
    generator = torch.Generator().manual_seed(seed)
    num_samples, seq_len = len(lengths), max(lengths)
    input_ids = torch.randint(9, vocab_size, (num_samples, seq_len), generator=generator)
    attention_mask = torch.zeros(num_samples, seq_len, dtype=torch.long)
    token_mask = torch.zeros(num_samples, seq_len)
    for row, length in enumerate(lengths):
        attention_mask[row, :length] = 1
        token_mask[row, PROMPT_LENGTH:length] = 1
    input_ids = input_ids * attention_mask  # pad id 0
    sign = torch.tensor([1.0 if row % 2 else -1.0 for row in range(num_samples)])
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        token_mask=token_mask,
        generation_logprobs=torch.zeros(num_samples, seq_len),
        rewards=(sign > 0).float(),
        sample_mask=torch.ones(num_samples),
        group_ids=torch.arange(num_samples) // 2,
        prompt_lengths=torch.full((num_samples,), PROMPT_LENGTH),
        truncated=torch.zeros(num_samples, dtype=torch.bool),
        policy_versions=torch.zeros(num_samples, dtype=torch.long),
        message_logs=tuple(
            (MessageSpan("user", PROMPT_LENGTH), MessageSpan("assistant", length - PROMPT_LENGTH)) for length in lengths
        ),
        advantages=sign[:, None] * token_mask,
        returns=torch.where(sign > 0, 1.0, -0.5)[:, None] * token_mask,
    )


def policy_loss_settings(**overrides: Any) -> PolicyLossSettings:
    settings: dict[str, Any] = {
        "ratio_clip_min": 0.2,
        "ratio_clip_max": 0.2,
        "ratio_clip_c": None,
        "disable_ppo_ratio": False,
        "force_on_policy_ratio": False,
        "token_level_loss": True,
        "sequence_level_importance_ratios": False,
        "reference_policy_kl_penalty": 0.0,
        "reference_policy_kl_type": "k3",
        "kl_input_clamp_value": 20.0,
        "kl_output_clamp_value": 10.0,
        "use_kl_in_reward": False,
        "behaviour_kl_penalty": 0.0,
        "behaviour_kl_type": "k3",
        "behaviour_kl_input_clamp_value": 20.0,
        "behaviour_kl_output_clamp_value": 10.0,
        "use_importance_sampling_correction": True,
        "truncated_importance_sampling_type": None,
        "truncated_importance_sampling_ratio": None,
        "truncated_importance_sampling_ratio_min": None,
        "use_on_policy_kl_approximation": False,
        "positive_example_nll_weight": 0.0,
    }
    return PolicyLossSettings(**(settings | overrides))


def policy_settings(**overrides: Any) -> PolicyWorkerSettings:
    """The worker tests' PolicyWorkerSettings; keyword arguments replace fields."""
    defaults = PolicyWorkerSettings(
        dtype="float32",
        tokenizer_path=None,
        optimizer=OptimizerSettings(lr=1e-2, weight_decay=0.0, betas=(0.9, 0.999), eps=1e-8),
        scheduler=SchedulerSettings(name="constant", warmup_steps=0, total_steps=None, min_lr_ratio=0.0),
        scheduler_total_steps=None,
        max_grad_norm=1.0,
        train_global_batch_size=None,
        train_micro_batch_size=2,
        max_tokens_per_microbatch=None,
        logprob_batch_size=3,
        activation_checkpointing=False,
        temperature=1.0,
        logprob_chunk_size=16,
        loss_settings=policy_loss_settings(),
        keep_reference=False,
    )
    return dataclasses.replace(defaults, **overrides)


def value_settings(**overrides: Any) -> ValueWorkerSettings:
    """ValueWorkerSettings with the policy defaults' shared fields and an unclipped loss; keyword arguments
    replace fields."""
    policy = policy_settings()
    shared = {spec.name: getattr(policy, spec.name) for spec in dataclasses.fields(TrainedModelSettings)}
    defaults = ValueWorkerSettings(**shared, loss_settings=ValueLossSettings(scale=1.0, cliprange=None))
    return dataclasses.replace(defaults, **overrides)


def with_old_logprobs(worker: PolicyWorker, batch: TrainBatch) -> TrainBatch:
    """The batch as the driver hands it to train(): old logprobs scored now, generated by the same weights."""
    old = worker.logprobs(batch)
    return batch.with_fields(old_logprobs=old, generation_logprobs=old.clone())


def weights_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
