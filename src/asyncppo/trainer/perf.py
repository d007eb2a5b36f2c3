"""The per-step throughput metrics `perf/*`: model FLOPs utilisation per phase, padding waste, trained tokens/s.

`build_run` builds one `PerfMeter` (`perf_meter`) and hangs it on the Run; the driver loop calls `step_metrics` once
per step, after timing/step is set. FLOPs come from `models/flops.py` over the batch's real sequence lengths (S_b =
attention_mask row sums); the peak per device from cluster.peak_tflops or `KNOWN_PEAK_TFLOPS`:

    phase               FLOPs                                   devices        seconds
    generation          forward(policy)                         -              (inside timing/step)
    values              forward(critic)                         critic ranks   timing/values
    logprobs            forward(policy)                         policy ranks   timing/logprobs
    reference_logprobs  forward(policy)                         policy ranks   timing/reference_logprobs
    critic_train        3 x forward(critic) x critic_ppo_epochs critic ranks   timing/critic_train
    policy_train        3 x forward(policy) x ppo_epochs        policy ranks   timing/policy_train

    perf/<phase>_mfu             = FLOPs / (seconds x devices x peak), for each phase that ran
    perf/step_flops_utilization = every phase's FLOPs / (timing/step x every device of the run x peak)
    perf/padding_ratio           = the workers' computed / real token counters (ppo_step sums them over passes)
    perf/trained_tokens_per_s    = sum(S_b) x ppo_epochs / timing/step (0 when the policy did not train)
"""

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
from transformers import AutoConfig, PretrainedConfig

from asyncppo.config import RunConfig
from asyncppo.models.flops import TRAINING_FORWARDS, DecoderShape, FlopCounter, Head
from asyncppo.trainer.placement import Layout
from asyncppo.trainer.setup import ModelPaths
from asyncppo.types import TrainBatch

# Dense bf16/fp16 tensor-core TFLOP/s per device (vendor datasheets, without sparsity), matched as whole words
# against torch.cuda.get_device_name() in this order: a variant comes before its family's plain name.
KNOWN_PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),  # SXM: "NVIDIA H100 80GB HBM3"
    ("H200 NVL", 835.0),
    ("H200", 989.0),
    ("GH200", 989.0),
    ("H800", 989.0),
    ("H20", 148.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("B200", 2250.0),
    ("GB200", 2500.0),
    ("L40S", 362.0),
    ("L40", 181.0),
    ("L4", 121.0),
    ("MI300X", 1307.0),
)
log = logging.getLogger(__name__)
SIXTEEN_BIT = ("bfloat16", "float16")
TIMING_STEP = "timing/step"
# The workers' token counters (policy/..., critic/...): forwards computed (padding and stand-in micro-batches
# included) and the real tokens they were given, for training and for no-grad scoring.
TOKEN_COUNTERS = (("tokens_computed", "tokens_real"), ("scored_tokens_computed", "scored_tokens_real"))
WORKER_NAMESPACES = ("policy/", "critic/")


def known_peak_tflops(device_name: str) -> float | None:
    """The table's dense 16-bit TFLOP/s of a device named like torch.cuda.get_device_name(); None when unknown."""
    for name, tflops in KNOWN_PEAK_TFLOPS:
        if re.search(rf"\b{re.escape(name)}\b", device_name, flags=re.IGNORECASE):
            return tflops
    return None


def peak_flops_per_device(override_tflops: float | None, device_name: str | None, sixteen_bit: bool) -> float | None:
    """FLOP/s per device: cluster.peak_tflops when set; else the table's entry for a GPU (`device_name`, None on
    CPU) when the models train in 16 bits (the table holds 16-bit peaks); else None (no MFU is logged)."""
    if override_tflops is not None:
        return override_tflops * 1e12
    if device_name is None or not sixteen_bit:
        return None
    tflops = known_peak_tflops(device_name)
    return tflops * 1e12 if tflops is not None else None


def padding_ratio(metrics: Mapping[str, float]) -> float | None:
    """Tokens the trainers' forwards computed / real tokens they were given, over every counter pair reported
    (1.0 = no padding waste); None when no worker reported its counters."""
    computed = real = 0.0
    for namespace in WORKER_NAMESPACES:
        for computed_key, real_key in TOKEN_COUNTERS:
            if f"{namespace}{computed_key}" in metrics and f"{namespace}{real_key}" in metrics:
                computed += metrics[f"{namespace}{computed_key}"]
                real += metrics[f"{namespace}{real_key}"]
    return computed / real if real > 0 else None


@dataclass(frozen=True)
class PerfMeter:
    """What the run's `perf/*` metrics need, fixed at build time: FLOP counters, the peak, devices and epochs."""

    policy: FlopCounter | None
    """None when a model's shape is not one `models/flops.py` counts: then no FLOP metric is logged."""
    critic: FlopCounter | None
    """None for a run without a critic (or when `policy` is None)."""
    peak_flops: float | None
    """FLOP/s per device; None: no FLOP metric is logged (CPU, unknown GPU, float32 without cluster.peak_tflops)."""
    policy_devices: int
    critic_devices: int
    all_devices: int
    """Every device of the run: the trainers' and the non-colocated generators'."""
    ppo_epochs: int
    critic_ppo_epochs: int

    def step_metrics(self, batch: TrainBatch, metrics: Mapping[str, float]) -> dict[str, float]:
        """The step's `perf/*` metrics from its collated batch and its metrics (timing/*, the worker counters)."""
        # torch's stub types tolist() as a bare `list`; a 1-D integer tensor gives a list of ints.
        lengths = cast(list[int], batch.attention_mask.sum(dim=1).tolist())  # pyright: ignore[reportUnknownMemberType]
        step_seconds = metrics[TIMING_STEP]
        policy_trained = "timing/policy_train" in metrics  # not during the critic's warm-up
        trained_tokens = sum(lengths) * self.ppo_epochs if policy_trained else 0
        perf = {"perf/trained_tokens_per_s": trained_tokens / step_seconds if step_seconds > 0 else 0.0}
        padding = padding_ratio(metrics)
        if padding is not None:
            perf["perf/padding_ratio"] = padding
        if self.peak_flops is None or self.policy is None:
            return perf
        # The step's batch is what was generated for it (in async runs partly during earlier steps; groups that
        # dynamic sampling dropped are not counted).
        step_flops = self.policy.forward(lengths)
        for phase, (flops, devices) in self._phase_flops(self.policy, lengths).items():
            seconds = metrics.get(f"timing/{phase}")
            if seconds is None:
                continue  # the phase did not run this step
            step_flops += flops
            if seconds > 0 and devices > 0:
                perf[f"perf/{phase}_mfu"] = flops / (seconds * devices * self.peak_flops)
        if step_seconds > 0:
            perf["perf/step_flops_utilization"] = step_flops / (step_seconds * self.all_devices * self.peak_flops)
        return perf

    def _phase_flops(self, policy_counter: FlopCounter, lengths: Sequence[int]) -> dict[str, tuple[int, int]]:
        """Phase -> (its model FLOPs on these sequences, the devices it runs on); see the module docstring.

        The privileged critic's prefixes are not in the policy-layout lengths: its FLOPs are then a lower bound.
        """
        policy = policy_counter.forward(lengths)
        critic = self.critic.forward(lengths) if self.critic is not None else 0
        return {
            "values": (critic, self.critic_devices),
            "logprobs": (policy, self.policy_devices),
            "reference_logprobs": (policy, self.policy_devices),
            "critic_train": (TRAINING_FORWARDS * critic * self.critic_ppo_epochs, self.critic_devices),
            "policy_train": (TRAINING_FORWARDS * policy * self.ppo_epochs, self.policy_devices),
        }


def _flop_counter(model_dir: Path, head: Head) -> FlopCounter | None:
    """The model's FlopCounter; None (with a warning) when its config is not a shape `models/flops.py` counts: a
    throughput metric never stops a run."""
    # transformers leaves from_pretrained's keyword arguments untyped; a model directory gives a PretrainedConfig.
    config = cast(PretrainedConfig, AutoConfig.from_pretrained(model_dir))  # pyright: ignore[reportUnknownMemberType]
    try:
        return FlopCounter.for_model(DecoderShape.from_config(config), head)
    except ValueError as error:
        log.warning("no perf/*_mfu metrics: %s (%s)", error, model_dir)
        return None


def perf_meter(config: RunConfig, paths: ModelPaths, layout: Layout, device: str) -> PerfMeter:
    """The run's PerfMeter: the models' shapes read once from their directories, the peak of the driver's GPU."""
    policy = _flop_counter(paths.policy, "policy")
    critic = _flop_counter(paths.value, "critic") if paths.value is not None and policy is not None else None
    if paths.value is not None and critic is None:
        policy = None  # without the critic's FLOPs the step's total would be short
    precisions = [config.model.precision] + ([config.value.precision] if config.value is not None else [])
    device_name = torch.cuda.get_device_name() if device == "cuda" else None
    return PerfMeter(
        policy=policy,
        critic=critic,
        peak_flops=peak_flops_per_device(
            config.cluster.peak_tflops, device_name, all(precision in SIXTEEN_BIT for precision in precisions)
        ),
        policy_devices=layout.policy_ranks,
        critic_devices=layout.critic_ranks,
        all_devices=layout.total,
        ppo_epochs=config.ppo.ppo_epochs,
        critic_ppo_epochs=config.ppo.resolved_critic_ppo_epochs,
    )
