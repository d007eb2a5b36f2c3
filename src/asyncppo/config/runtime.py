"""Config sections around the algorithm: generation, environment, cluster, checkpoints (data: data.py; logging:
logger.py)."""

import re
from typing import TYPE_CHECKING, Literal, Self

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, field_validator, model_validator

from asyncppo.config.base import RuleError, Section

if TYPE_CHECKING:  # types.py imports torch, which config-only commands never load (tests/cli/test_imports.py)
    from asyncppo.types import SamplingProfile


class GenerationResourcesConfig(Section):
    """Devices of non-colocated generators (NeMo-RL's names); both null = `generation.num_workers` generators
    beside the trainers."""

    num_nodes: PositiveInt | None = None
    """Whole nodes given to the generators (a multi-node cluster: the trainers take the other nodes); null = the
    generators share the trainers' nodes."""
    gpus_per_node: PositiveInt | None = None
    """Generator devices per generator node, one generator worker each (generation.num_workers = this x
    num_nodes); null = generation.num_workers."""

    @property
    def provided_any(self) -> bool:
        """Whether either key is set."""
        return self.num_nodes is not None or self.gpus_per_node is not None


class ColocationConfig(Section):
    """Where generation runs relative to training."""

    enabled: bool = True
    """Generate inside the policy workers' processes (sync only) instead of on separate generator workers."""
    resources: GenerationResourcesConfig = GenerationResourcesConfig()
    """Devices of the generators when not colocated."""

    @model_validator(mode="after")
    def _check_resources(self) -> Self:
        if self.enabled and self.resources.provided_any:
            raise RuleError(
                "resources",
                "sets generator devices, but generation runs inside the policy workers (enabled: true); set "
                "generation.colocated.enabled: false or remove generation.colocated.resources",
            )
        return self


class WeightSyncConfig(Section):
    """Pushing policy weights to non-colocated generators."""

    bucket_size_mb: PositiveInt = 256
    """Flat bucket size of each broadcast."""
    timeout_s: float = Field(default=120.0, gt=0)
    """Timeout of every collective; a sync that takes longer fails naming the rank and bucket."""
    checksum_period: NonNegativeInt = 1
    """Compare generator and trainer weight checksums every N pushes; 0 never."""

    @property
    def bucket_size_bytes(self) -> int:
        """bucket_size_mb in bytes."""
        return self.bucket_size_mb * 1024 * 1024


class GenerationConfig(Section):
    """Sampling and the generation engine."""

    backend: Literal["auto", "hf", "graph"] = "auto"
    """Generation engine: `graph` (continuous batching over a preallocated KV cache, CUDA-graphed decode; Llama,
    Qwen2/2.5/3 and Mistral models; runs eagerly on CPU too), `hf` (transformers; any causal LM, the reference),
    `auto` = graph on CUDA for a supported model, else hf."""
    max_new_tokens: PositiveInt = 256
    """Most tokens generated per model call."""
    temperature: float = Field(default=1.0, gt=0)
    """Sampling temperature; training logprobs use the same temperature."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    """Nucleus sampling mass; 1.0 disables."""
    top_k: NonNegativeInt = 0
    """Top-k sampling; 0 disables (never inherit transformers' implicit top_k=50)."""
    val_temperature: float | None = Field(default=None, ge=0)
    """Validation temperature; null = temperature, 0 = greedy."""
    val_top_p: float | None = Field(default=None, gt=0, le=1)
    """Validation nucleus mass; null = top_p."""
    stop_token_ids: list[int] | None = None
    """Extra token ids that end a generation (EOS always does)."""
    max_batch_size: PositiveInt = 64
    """Most requests decoded together by the batching loop."""
    ignore_eos: bool = False
    """Generate exactly max_new_tokens per rollout (EOS and stop ids do not end it); for benchmarks."""
    gpu_memory_utilization: float = Field(default=0.6, gt=0, le=1)
    """graph backend on CUDA: share of the GPU's memory the generating process may fill, KV cache included."""
    kv_cache_tokens: PositiveInt | None = None
    """graph backend: KV cache size in tokens (slots of max_total_sequence_length); null = sized from
    gpu_memory_utilization on CUDA (at most 2 x max_batch_size slots), 2 x max_batch_size slots on CPU."""
    enable_prefix_caching: bool = True
    """graph backend: a prompt that starts with the tokens of a finished request whose KV is still resident
    (a multi-turn conversation's history) reuses that KV instead of recomputing it; never across weight
    versions."""
    num_workers: PositiveInt = 1
    """Generator workers when not colocated, one device each; set from generation.colocated.resources when that
    is given."""
    max_restarts: NonNegativeInt = 3
    """Generator processes (not colocated) that may die and be restarted per run (counted from its start or
    resume): each comes back in place after a back-off (1 s, doubling for quick repeats, at most 30 s), gets the
    current weights before it serves, and the rollouts it held run again. One more death ends the run with one
    line; 0 = the first death does."""
    colocated: ColocationConfig = ColocationConfig()
    """Colocation of generation with training."""
    weight_sync: WeightSyncConfig = WeightSyncConfig()
    """Weight pushes to non-colocated generators."""

    @model_validator(mode="after")
    def _workers_from_resources(self) -> Self:
        resources = self.colocated.resources
        if resources.gpus_per_node is None:
            if resources.num_nodes is not None:
                raise RuleError(
                    "colocated.resources.gpus_per_node",
                    f"must be set with colocated.resources.num_nodes={resources.num_nodes} (generator devices per "
                    "node)",
                )
            return self
        count = resources.gpus_per_node * (resources.num_nodes or 1)
        if self.provided("num_workers") and self.num_workers != count:
            raise RuleError(
                "num_workers",
                f"{self.num_workers} disagrees with colocated.resources: gpus_per_node={resources.gpus_per_node} x "
                f"num_nodes={resources.num_nodes or 1} = {count} generators; set one of them",
            )
        return self.model_copy(update={"num_workers": count})

    @property
    def train_profile(self) -> "SamplingProfile":
        """(temperature, top_p) of training rollouts."""
        from asyncppo.types import SamplingProfile  # here, not at the top: see the TYPE_CHECKING import

        return SamplingProfile(self.temperature, self.top_p)

    @property
    def validation_profile(self) -> "SamplingProfile":
        """(val_temperature, val_top_p), each falling back to its training value when null."""
        from asyncppo.types import SamplingProfile  # here, not at the top: see the TYPE_CHECKING import

        return SamplingProfile(
            self.temperature if self.val_temperature is None else self.val_temperature,
            self.top_p if self.val_top_p is None else self.val_top_p,
        )


class GymConfig(Section):
    """NeMo-Gym-compatible environment servers."""

    launch: Literal["builtin", "external"] = "builtin"
    """`builtin`: the trainer starts asyncppo's own gym servers; `external`: connect to running ones."""
    head_server_url: str | None = None
    """Head server for config lookup (GET /global_config_dict_yaml); external launch."""
    agent_urls: dict[str, str] = Field(default_factory=dict)
    """Agent name -> base URL, used instead of a head server lookup."""
    max_concurrency: PositiveInt = 32
    """Rollouts in flight against the agents at once."""
    rollout_deadline_s: float = Field(default=600.0, gt=0)
    """Per-rollout deadline; a rollout past it fails and is counted."""
    max_retries: NonNegativeInt = 3
    """Retries of a whole rollout after a transient failure (connection, 5xx, 408, 429)."""
    backoff_s: float = Field(default=1.0, ge=0)
    """Sleep before the first retry; doubled before each further one (all within the rollout deadline)."""
    max_failed_groups_per_step: NonNegativeInt = 8
    """Prompt groups whose rollout may fail (after retries) while one step's batch is filled; each failed group
    is dropped (counted in `rollout/failed_groups` and the accounting) and replaced by a fresh prompt. One more
    failure stops the run with an error naming the step and the last failure; 0 = the first failure stops it.
    Runs without the gym: ppo.max_failed_groups_per_step."""
    startup_timeout_s: float = Field(default=30.0, ge=0)
    """launch: external: how long `train` waits, when it starts, for a gym URL that does not answer yet (head_server_url
    or each of agent_urls, polled); still unreachable after it: exit 2 with one line. 0 = do not wait."""
    resources: list[str] = Field(default_factory=lambda: ["math"], min_length=1)
    """Built-in environments the trainer (launch: builtin) or `asyncppo gym serve` starts, one simple agent
    each, named `<resources>_simple_agent`: `math`, `weather`, `multi_step`, `session_counter`."""
    default_agent: str | None = None
    """Agent instance of rows whose `agent_ref` names none (as NeMo-Gym's rollout collector's `agent_name`);
    null = the gym's only agent, and an error naming the row when it has several."""
    max_steps: PositiveInt = 8
    """Model calls per rollout of the built-in simple agent (it also stops on a turn without tool calls)."""
    model_name: str = "policy"
    """Model name the policy server serves (agents send it as `model`)."""
    policy_server_port: NonNegativeInt = 0
    """Port of the first policy server (generator worker i listens on port + i); 0 = free ports."""
    api_key: str | None = None
    """Bearer key (`Authorization: Bearer <key>`) that the policy server and the built-in head, agent and resources
    servers require on every route but `GET /health`; the trainer's gym client and the built-in agents send it.
    null = no key: any local process may call them (see docs/security.md)."""
    max_request_bytes: PositiveInt = 8 * 1024 * 1024
    """Largest request body the policy server and the built-in gym servers accept; a larger one is answered 413
    before its body is read (checked on Content-Length, counted while a chunked body streams in)."""
    thinking_tags: tuple[str, str] = ("<think>", "</think>")
    """[start, end] of the model's reasoning blocks; the reward penalties cut each assistant turn at them."""
    invalid_tool_call_patterns: list[str] = Field(default_factory=list[str])
    """Regular expressions (Python `re.search`) over the text of each gym result's assistant messages (parsed tool
    calls excluded): a match is tool-call markup the agent did not execute (`<tool_call>`), counted in
    `gym/invalid_tool_calls` and zeroed by reward_penalties.penalize_invalid_tool_call."""
    effort_levels: list[str] = Field(default_factory=lambda: ["low", "medium", "high"], min_length=1)
    """Allowed values of reasoning_effort and of every row's `responses_create_params.reasoning.effort`."""
    reasoning_effort: str | None = None
    """Stamped as `responses_create_params.reasoning.effort` into rows without one; null = rows keep theirs."""

    @model_validator(mode="after")
    def _check_text_knobs(self) -> Self:
        start, end = self.thinking_tags
        if not start or not end or start == end:
            raise RuleError("thinking_tags", f"{list(self.thinking_tags)} must be two different non-empty tags")
        for index, pattern in enumerate(self.invalid_tool_call_patterns):
            try:
                re.compile(pattern)
            except re.error as error:
                raise RuleError(f"invalid_tool_call_patterns.{index}", f"{pattern!r} is not a regex: {error}") from None
        effort, levels = self.reasoning_effort, self.effort_levels
        if effort is not None and effort not in levels:
            raise RuleError("reasoning_effort", f"{effort!r} is not one of effort_levels {levels}")
        return self

    @model_validator(mode="after")
    def _check_launch(self) -> Self:
        if self.launch == "external" and (self.head_server_url is None) == (not self.agent_urls):
            raise RuleError(
                "head_server_url",
                "launch: external needs exactly one of head_server_url and agent_urls (where the agents are)",
            )
        if self.launch == "builtin" and (self.head_server_url is not None or self.agent_urls):
            raise RuleError("launch", "builtin starts its own servers: remove head_server_url and agent_urls")
        return self


class EnvConfig(Section):
    """Where rewards come from: a reward function on single-turn rollouts, or gym environments."""

    reward_function: str = "math"
    """Single-turn reward: `math`, `exact_match`, or `module:function` for a user function."""
    reward_timeout_s: float = Field(default=60.0, gt=0)
    """Deadline of one reward-function call; a call past it fails its prompt group (within
    ppo.max_failed_groups_per_step) and is abandoned on its own thread."""
    should_use_nemo_gym: bool = False
    """Collect rollouts from NeMo-Gym-compatible servers instead of single-turn generation."""
    should_log_nemo_gym_responses: bool = False
    """Append every raw gym `/run` result (with its group id and sample index) to `gym_results.jsonl` in the run
    directory, for debugging environments; the per-step train data records (logger.train_data_period) are then
    not written."""
    gym: GymConfig = GymConfig()
    """Gym servers."""

    @field_validator("reward_function")
    @classmethod
    def _check_reward_function(cls, value: str) -> str:
        if value in ("math", "exact_match"):
            return value
        module, sep, function = value.partition(":")
        if not sep or not module or not function:
            raise ValueError(f"{value!r} is not 'math', 'exact_match' or 'module:function'")
        return value


class RewardPenaltiesConfig(Section):
    """Gym reward zeroing, applied before advantages (so it stays consistent with GAE)."""

    penalize_duplicated_reasoning: bool = False
    """Zero the reward when the reasoning repeats itself."""
    penalize_empty_final_answer: bool = False
    """Zero the reward when the final answer is empty."""
    penalize_unwanted_tokens: bool = False
    """Zero the reward when the response contains any of token_ids_unwanted."""
    penalize_malformed_think_tag: bool = False
    """Zero the reward when think tags (env.gym.thinking_tags) are unbalanced or nested."""
    penalize_invalid_tool_call: bool = False
    """Zero the reward when an assistant message's text matches env.gym.invalid_tool_call_patterns."""
    token_ids_unwanted: list[int] = Field(default_factory=list[int])
    """Token ids penalised by penalize_unwanted_tokens."""

    @model_validator(mode="after")
    def _check_unwanted(self) -> Self:
        if self.penalize_unwanted_tokens and not self.token_ids_unwanted:
            raise RuleError("token_ids_unwanted", "must list token ids when penalize_unwanted_tokens is true")
        return self

    @property
    def any_enabled(self) -> bool:
        """Whether any penalty is switched on."""
        return (
            self.penalize_duplicated_reasoning
            or self.penalize_empty_final_answer
            or self.penalize_unwanted_tokens
            or self.penalize_malformed_think_tag
            or self.penalize_invalid_tool_call
        )


class ClusterConfig(Section):
    """Devices and the Ray cluster."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    """`auto` uses CUDA when available."""
    num_nodes: PositiveInt = 1
    """Nodes of the Ray cluster the run uses (with gpus_per_node: its devices)."""
    gpus_per_node: NonNegativeInt = 0
    """Devices per node: GPUs on CUDA runs; on CPU runs, worker slots of one logical Ray CPU each. The trainers get
    every device the generators do not (gpus_per_node x num_nodes - generation.num_workers data-parallel ranks).
    0 = not stated: one trainer rank, and one more device per non-colocated generator."""
    ray_address: str | None = None
    """An existing Ray cluster to join (`ray start --head` prints it); null = the RAY_ADDRESS environment
    variable, else a local cluster bound to 127.0.0.1."""

    num_cpus: PositiveInt | None = None
    """CPUs given to a local Ray cluster; null = all."""
    peak_tflops: PositiveFloat | None = None
    """Per-device dense TFLOP/s of the training precision, overriding the table of known GPUs (README, Performance
    metrics) that the `perf/*_mfu` metrics and `perf/step_flops_utilization` divide by; null = the table's entry for
    the driver's GPU (none on CPU, for an unknown GPU or with float32 training: those metrics are then not logged)."""


# What checkpointing.metric_name may rank by: every metric the driver logs under val/ (trainer/run.py, Run.validate)
# and train/ (trainer/ppo_step.py), written `val:<key>` / `train:<key>`. A name outside this list is never logged, so
# keep_top_k would silently keep the newest checkpoints; tests/trainer/test_ranking_metrics.py keeps it in step with
# the logged keys.
RANKING_METRICS: tuple[str, ...] = (
    "val:reward_mean",
    "val:response_length_mean",
    "val:turns_per_sample",
    "val:num_samples",
    "val:failed_groups",
    "train:reward_mean",
    "train:processed_reward_mean",
    "train:reward_std",
    "train:response_length_mean",
    "train:response_length_max",
    "train:sequence_length_mean",
    "train:truncated_frac",
    "train:num_samples",
    "train:policy_trained",
)
# NeMo-RL's names for metrics logged here under another name, so a ported config's error says what to write.
_NEMO_RL_METRIC_NAMES = {"val:accuracy": "val:reward_mean"}


class CheckpointingConfig(Section):
    """Step checkpoints and resume."""

    enabled: bool = True
    """Write checkpoints and resume from the newest complete one."""
    checkpoint_dir: str | None = None
    """Checkpoint directory; null = `checkpoints/` in the run directory."""
    save_period: PositiveInt = 10
    """Save every N steps (and always after the last step)."""
    keep_top_k: PositiveInt | None = None
    """Keep the best k checkpoints by metric_name (the newest is always kept); null keeps all."""
    metric_name: str | None = None
    """Ranking metric, one the run logs: `val:reward_mean` (mean validation reward), `train:reward_mean`, ...
    (an unknown name is rejected with the full list); required with keep_top_k."""
    higher_is_better: bool = True
    """Direction of metric_name."""
    checkpoint_must_save_by: str | None = None
    """Wall-clock budget `DD:HH:MM:SS`; when it runs out the run saves and stops."""

    @field_validator("checkpoint_must_save_by")
    @classmethod
    def _check_deadline(cls, value: str | None) -> str | None:
        if value is not None:
            parts = value.split(":")
            if len(parts) != 4 or not all(part.isdigit() for part in parts):
                raise ValueError(f"{value!r} is not DD:HH:MM:SS")
        return value

    @model_validator(mode="after")
    def _check_ranking(self) -> Self:
        if self.keep_top_k is not None and self.metric_name is None:
            raise RuleError("metric_name", "required when keep_top_k is set")
        if self.metric_name is not None and self.metric_name not in RANKING_METRICS:
            alias = _NEMO_RL_METRIC_NAMES.get(self.metric_name)
            hint = f" (NeMo-RL's {self.metric_name} is {alias} here)" if alias else ""
            raise RuleError(
                "metric_name",
                f"{self.metric_name!r} is not a metric the run logs{hint}; "
                f"expected one of {', '.join(RANKING_METRICS)}",
            )
        return self

    @property
    def must_save_by_seconds(self) -> float | None:
        """checkpoint_must_save_by in seconds."""
        if self.checkpoint_must_save_by is None:
            return None
        days, hours, minutes, seconds = (int(part) for part in self.checkpoint_must_save_by.split(":"))
        return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)
