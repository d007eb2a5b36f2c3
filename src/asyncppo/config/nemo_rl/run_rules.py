"""The run around the algorithm: environments, checkpoints, cluster, loggers, and NeMo-RL's other trainers'
sections (the data plane, the SingleController's `async_rl`, on-policy distillation).

Environments: `env.math` is asyncppo's math reward; `env.nemo_gym` runs through NeMo-Gym servers that asyncppo
connects to (it does not launch them, so their server settings are yours to pass on); any other environment
section (a reward model, a game) is a feature asyncppo lacks, refused once at the section's first key.
"""

from typing import Any, cast

from asyncppo.config.nemo_rl.data_rules import has_validation_rows
from asyncppo.config.nemo_rl.rules import (
    Outcome,
    Rule,
    Source,
    algorithm_section,
    backend,
    feature_settings,
    lacks,
    mapped,
    neutral,
    neutral_when,
)
from asyncppo.config.runtime import RANKING_METRICS

NEMO_GYM_HEAD_SERVER = "http://127.0.0.1:11000"
"""Where NeMo-Gym's head server listens by default; a ported gym run connects to it."""
BUILT_IN_ENVIRONMENTS = ("math", "nemo_gym")
# NeMo-RL's names of the mean validation reward (its math environment's reward is the accuracy).
_METRIC_NAMES: dict[str, str] = {
    **dict.fromkeys(("val:accuracy", "val_reward", "val_accuracy", "val:total_reward/mean"), "val:reward_mean"),
    # NeMo-RL's training total_reward is the reward after shaping: asyncppo's processed reward.
    "train:total_reward/mean": "train:processed_reward_mean",
}
_GYM_SERVERS = "NeMo-Gym server settings: give them to the servers you start (env.gym.launch=external)"
_GPU_MONITOR = "GPU monitor; asyncppo logs timing/* and memory in metrics.jsonl"


def _cluster_gpus(key: str, value: Any, source: Source) -> Outcome:
    # Mapped as it is; a colocated run over several GPUs says here why `asyncppo train` will stop at start.
    nodes = source.get("cluster.num_nodes", 1)
    colocated = source.enabled("policy.generation.colocated")
    if not colocated or not isinstance(value, int) or not isinstance(nodes, int) or value * nodes <= 1:
        return mapped(key, value)
    return mapped(
        key,
        value,
        f"colocated: {value * nodes} trainer ranks, refused at start since a colocated engine cannot run over FSDP "
        "shards; override cluster.gpus_per_node=1 or generate non-colocated",
    )


def _metric_name(_key: str, value: Any, _source: Source) -> Outcome:
    name = _METRIC_NAMES.get(value, value) if isinstance(value, str) else value
    if name is not None and name not in RANKING_METRICS:
        return Outcome(
            "refused", f"{value!r}: {lacks('such metric to rank checkpoints by')} ({', '.join(RANKING_METRICS)})"
        )
    return mapped("checkpointing.metric_name", name, f"NeMo-RL's {value}" if name != value else "")


def _keep_top_k(key: str, value: Any, source: Source) -> Outcome:
    metric = source.get("checkpointing.metric_name")
    if value is not None and metric is None:
        return Outcome("backend", "no ranking metric: asyncppo keeps every checkpoint (NeMo-RL: the newest k)")
    never_validated = source.get(f"{algorithm_section(source)}.val_period") in (0, None) or not has_validation_rows(
        source
    )
    if value is not None and isinstance(metric, str) and metric.startswith("val") and never_validated:
        return Outcome("backend", f"{metric} is never logged during the run: asyncppo keeps every checkpoint")
    return mapped(key, value)


def _checkpointing(rule: Rule) -> Rule:
    """A checkpoint setting, dropped while checkpointing is off (asyncppo checks some of them even then)."""

    def gated(key: str, value: Any, source: Source) -> Outcome:
        if source.get("checkpointing.enabled") is False:
            return Outcome("neutral", "checkpointing is off (checkpointing.enabled: false)")
        return rule(key, value, source)

    return gated


def _nemo_gym_configs(_key: str, value: Any, _source: Source) -> Outcome:
    return Outcome(
        "mapped",
        f"env.gym.launch=external, env.gym.head_server_url={NEMO_GYM_HEAD_SERVER} (asyncppo does not launch "
        f"NeMo-Gym: start the servers of {value} yourself)",
        {"env.gym.launch": "external", "env.gym.head_server_url": NEMO_GYM_HEAD_SERVER},
    )


def _first_leaf(node: Any, prefix: str) -> str:
    while isinstance(node, dict) and node:
        name, node = next(iter(cast(dict[str, Any], node).items()))
        prefix = f"{prefix}.{name}"
    return prefix


def _other_environment(key: str, value: Any, source: Source) -> Outcome:
    """A section `env.<name>` of an environment asyncppo lacks: refused once, at its first key."""
    name = key.split(".")[1]
    first = _first_leaf(source.get(f"env.{name}"), f"env.{name}")
    if key == first:
        return Outcome("refused", f"{value!r}: {lacks(f'{name!r} environment')} (its rollouts and rewards)")
    return Outcome("backend", f"a setting of the {name!r} environment, refused at {first}")


def _flagged_samples(_key: str, value: Any, _source: Source) -> Outcome:
    if value is True:
        return Outcome("neutral", "asyncppo leaves samples the environment flags (mask_sample) out of the loss")
    return Outcome("refused", f"{value!r}: {lacks('training on samples the environment flags')}")


def _mlflow_run_name(_key: str, _value: Any, source: Source) -> Outcome:
    if source.get("logger.mlflow_enabled") is True:
        return Outcome("backend", "asyncppo names the MLflow run after the run directory (logger.log_dir)")
    return Outcome("neutral", "MLflow is off (logger.mlflow_enabled)")


def _gym_result_tables(_key: str, value: Any, _source: Source) -> Outcome:
    if value in (False, None):
        return Outcome("neutral", "off: no W&B tables of whole gym results")
    return Outcome("backend", "whole gym results go to gym_results.jsonl (env.should_log_nemo_gym_responses)")


RUN_RULES: list[tuple[str, Rule]] = [
    ("env.math.*", backend("the math reward runs in asyncppo's driver (env.reward_function=math)")),
    ("env.nemo_gym.config_paths", _nemo_gym_configs),
    ("env.nemo_gym.port_range_*", backend("NeMo-Gym server ports; env.gym.policy_server_port")),
    (
        "env.nemo_gym.num_gpu_nodes",
        neutral_when((0, None), "no GPU nodes for gym servers", "asyncppo does not place gym servers on GPUs"),
    ),
    (
        "env.nemo_gym.is_trajectory_collection",
        neutral_when((False, None), "training, not trajectory collection", lacks("trajectory-collection mode")),
    ),
    *[
        (f"env.nemo_gym.{name}", lambda k, v, _s: mapped(f"env.gym.{k.split('.')[-1]}", v))
        for name in ("thinking_tags", "invalid_tool_call_patterns", "effort_levels", "reasoning_effort")
    ],
    ("env.nemo_gym.*", backend(_GYM_SERVERS)),
    ("env.should_mask_flagged_samples", _flagged_samples),
    ("env.*.*", _other_environment),
    ("checkpointing.metric_name", _checkpointing(_metric_name)),
    ("checkpointing.keep_top_k", _checkpointing(_keep_top_k)),
    (
        "checkpointing.save_optimizer",
        neutral_when((True,), "asyncppo checkpoints always hold the optimizer", "asyncppo resumes with the optimizer"),
    ),
    ("checkpointing.model_save_format", backend("asyncppo writes its own checkpoint layout (safetensors)")),
    ("checkpointing.save_consolidated", backend("asyncppo's checkpoints are single-device, never sharded")),
    ("cluster.gpus_per_node", _cluster_gpus),
    ("cluster.segment_size", backend("NVLink-domain placement; asyncppo packs each worker group (Ray PACK)")),
    ("cluster.master_port_range_*", backend("torch.distributed ports; asyncppo's weight sync picks its own")),
    ("logger.monitor_gpus", backend(_GPU_MONITOR)),
    ("logger.gpu_monitoring.*", backend(_GPU_MONITOR)),
    ("logger.num_val_samples_to_print", backend("console sample printing; see the run's rollout dumps")),
    ("logger.tensorboard", backend("TensorBoard writes to the run directory: logger.tensorboard_enabled")),
    ("logger.tensorboard.*", backend("TensorBoard writes to the run directory: logger.tensorboard_enabled")),
    ("logger.swanlab_enabled", neutral_when((False,), "off: no SwanLab sink", lacks("SwanLab sink"))),
    ("logger.swanlab.*", feature_settings("swanlab_enabled", "the SwanLab sink")),
    ("logger.mlflow.run_name", _mlflow_run_name),
    ("logger.wandb.log_nemo_gym_full_result_tables", _gym_result_tables),
    ("data_plane", neutral("no data plane section")),
    ("data_plane.*", backend("NeMo-RL's TransferQueue data plane; asyncppo's driver moves batches itself")),
    ("on_policy_distillation", neutral_when((None,), "off: no distillation teachers", lacks("on-policy distillation"))),
    (
        "on_policy_distillation.*",
        neutral_when((None,), "off: no distillation teachers", lacks("on-policy distillation")),
    ),
    (
        "async_rl.sampler.name",
        lambda _k, v, _s: Outcome("refused", f"{v!r}: {lacks('SingleController streaming trainer (async_rl)')}"),
    ),
    ("async_rl.*", backend("a setting of the SingleController trainer, refused at async_rl.sampler.name")),
]
