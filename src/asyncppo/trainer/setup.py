"""A run's inputs, resolved once from its config: every command that loads a model starts here.

    RunConfig --resolve_setup--> RunSetup: device, model directories (tiny: and demo: names built into the
                                 cache), tokenizer, the ids that end and pad a generation, engine settings,
                                 rollout kind (gym or single-turn); with data=True also the checked rows and
                                 reward function (trainer/preflight.py)

Callers: `asyncppo train` (trainer/build.py `start_run`), `critic collect` and `critic pretrain`
(trainer/critic_*.py), `gym serve` and `bench generate` (cli/), `bench train` (trainer/train_bench.py). Each
takes the RunSetup and does only its own work with it.
"""

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from transformers import PreTrainedTokenizerBase

from asyncppo.config import ConfigError, RunConfig
from asyncppo.demo.arithmetic_policy import ensure_arithmetic_policy
from asyncppo.demo.tool_policy import ensure_tool_policy
from asyncppo.generation.engines import EngineSettings
from asyncppo.models.tiny import PRESETS, ensure_tiny
from asyncppo.models.tokenizer import load_tokenizer
from asyncppo.trainer.preflight import CheckedInputs, preflight

TINY_PREFIX = "tiny:"
DEMO_PREFIX = "demo:"
DEMO_MODELS = {"arithmetic": ensure_arithmetic_policy, "multi_step": ensure_tool_policy}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
RolloutKind = Literal["gym", "single_turn"]


def cache_dir() -> Path:
    """Where locally built artifacts (tiny and demo models) are cached: $ASYNCPPO_CACHE_DIR or ~/.cache/asyncppo."""
    return Path(os.environ.get("ASYNCPPO_CACHE_DIR", Path.home() / ".cache" / "asyncppo"))


def resolve_model_path(model_name: str, key: str = "model.model_name") -> Path:
    """A local model directory: `tiny:<preset>` and `demo:<name>` are built (once) into the cache."""
    if model_name.startswith(TINY_PREFIX):
        preset = model_name.removeprefix(TINY_PREFIX)
        if preset not in PRESETS:
            raise ConfigError([f"{key}: unknown tiny preset {preset!r}; expected one of {sorted(PRESETS)}"])
        return ensure_tiny(cache_dir() / "models", preset)
    if model_name.startswith(DEMO_PREFIX):
        name = model_name.removeprefix(DEMO_PREFIX)
        if name not in DEMO_MODELS:
            raise ConfigError([f"{key}: unknown demo model {name!r}; expected one of {sorted(DEMO_MODELS)}"])
        return DEMO_MODELS[name](cache_dir() / "models")
    path = Path(model_name).expanduser()
    if not (path / "config.json").is_file():
        raise ConfigError([f"{key}: {model_name!r} is not a local Hugging Face model directory (no config.json)"])
    return path


def resolve_device(config: RunConfig) -> str:
    """`cuda` or `cpu` from cluster.device (auto = CUDA when the driver sees a GPU)."""
    wanted = config.cluster.device
    if wanted == "cuda" and not torch.cuda.is_available():
        raise ConfigError(["cluster.device: 'cuda' but no CUDA device is visible"])
    if wanted == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return wanted


@dataclass(frozen=True)
class ModelPaths:
    """Resolved local directories of the run's models; `resolve` builds tiny and demo models on first use."""

    policy: Path
    tokenizer: Path
    value: Path | None

    @classmethod
    def resolve(cls, config: RunConfig) -> "ModelPaths":
        """model.model_name, model.tokenizer (null = the policy's directory) and value.model_name (null = the
        policy's model; None without a critic). A name that is neither a built name nor a local directory is a
        ConfigError naming its key, before anything loads."""
        policy = resolve_model_path(config.model.model_name)
        tokenizer = resolve_model_path(config.model.tokenizer, "model.tokenizer") if config.model.tokenizer else policy
        value = None
        if config.value is not None:
            value_name = config.value.model_name
            value = policy if value_name is None else resolve_model_path(value_name, "value.model_name")
        return cls(policy=policy, tokenizer=tokenizer, value=value)


def end_and_pad_ids(
    config: RunConfig, tokenizer: PreTrainedTokenizerBase, tokenizer_path: Path
) -> tuple[tuple[int, ...], int]:
    """(ids that end a generation: EOS plus generation.stop_token_ids, pad id: the tokenizer's or EOS)."""

    def token_id(value: object, name: str) -> int:
        if not isinstance(value, int):
            raise ConfigError(
                [f"model.tokenizer: the tokenizer at {tokenizer_path} has {name}={value!r}; generation needs one id"]
            )
        return value

    eos_id = token_id(tokenizer.eos_token_id, "eos_token_id")
    stop_ids: list[int] = list(config.generation.stop_token_ids or [])
    pad = eos_id if tokenizer.pad_token_id is None else token_id(tokenizer.pad_token_id, "pad_token_id")
    return tuple(sorted({eos_id, *stop_ids})), pad


def engine_settings(config: RunConfig, eos_token_ids: tuple[int, ...], pad_token_id: int) -> EngineSettings:
    generation = config.generation
    return EngineSettings(
        max_batch_size=generation.max_batch_size,
        max_context_length=config.model.max_total_sequence_length,
        seed=config.ppo.seed,
        eos_token_ids=eos_token_ids,
        pad_token_id=pad_token_id,
        backend=generation.backend,
        gpu_memory_utilization=generation.gpu_memory_utilization,
        kv_cache_tokens=generation.kv_cache_tokens,
        prefix_cache=generation.enable_prefix_caching,
        recompute_kv_after_weight_update=config.ppo.async_ppo.recompute_kv_cache_after_weight_updates,
    )


@dataclass(frozen=True)
class RunSetup:
    """A run's inputs, resolved once (`resolve_setup`)."""

    config: RunConfig
    device: str
    """`cuda` or `cpu`."""
    paths: ModelPaths
    tokenizer: PreTrainedTokenizerBase
    eos_token_ids: tuple[int, ...]
    """The ids that end a generation: EOS plus generation.stop_token_ids."""
    pad_token_id: int
    engine: EngineSettings
    rollout_kind: RolloutKind
    """`gym` (env.should_use_nemo_gym: agents over HTTP score the rollouts) or `single_turn` (a reward function)."""
    inputs: CheckedInputs | None
    """The pre-flight's rows and reward function; None when the command reads no data (gym serve, benches)."""

    @property
    def dtype(self) -> torch.dtype:
        """The policy's parameter dtype (model.precision)."""
        return DTYPES[self.config.model.precision]

    @property
    def checked_inputs(self) -> CheckedInputs:
        assert self.inputs is not None, "resolve_setup(config, data=True) loads the data"
        return self.inputs


def check_rollout_kind(config: RunConfig) -> RolloutKind:
    """The rollout kind, after refusing what it cannot run: several turns without the gym, or a built-in gym
    environment (env.gym.resources) that does not exist."""
    gym = config.env.should_use_nemo_gym
    if config.ppo.max_rollout_turns != 1:
        where = (
            "gym agents bound their own turns (the built-in agent: env.gym.max_steps)"
            if gym
            else "reward-function rollouts are single-turn; multi-turn rollouts come from the gym"
        )
        raise ConfigError([f"ppo.max_rollout_turns: {config.ppo.max_rollout_turns} is not supported: {where}"])
    if gym and config.env.gym.launch == "builtin":
        check_builtin_resources(config.env.gym.resources)
    return "gym" if gym else "single_turn"


def check_builtin_resources(resources: list[str]) -> None:
    """ConfigError for a built-in environment name (env.gym.resources) that does not exist."""
    # Imported here: the gym's HTTP stack (fastapi) loads only in runs that use the gym.
    from asyncppo.gym.servers.resources import RESOURCES_APPS

    unknown = [name for name in resources if name not in RESOURCES_APPS]
    if unknown:
        known = sorted(RESOURCES_APPS)
        raise ConfigError([f"env.gym.resources: unknown built-in environment {unknown[0]!r}; expected one of {known}"])


def resolve_setup(config: RunConfig, config_dir: Path | None = None, *, data: bool = False) -> RunSetup:
    """Resolve a run's inputs; every mistake found is a ConfigError naming its key.

    The cheap checks come first, so a mistake costs nothing: with `data` the pre-flight (sinks, reward function,
    data files; `config_dir` is searched for the reward module), then the rollout kind and the device; the model
    directories last (a `tiny:` or `demo:` name is built into the cache on first use).
    """
    inputs = preflight(config, config_dir) if data else None
    rollout_kind = check_rollout_kind(config)
    device = resolve_device(config)
    paths = ModelPaths.resolve(config)
    tokenizer = load_tokenizer(paths.tokenizer)
    eos, pad = end_and_pad_ids(config, tokenizer, paths.tokenizer)
    return RunSetup(
        config=config,
        device=device,
        paths=paths,
        tokenizer=tokenizer,
        eos_token_ids=eos,
        pad_token_id=pad,
        engine=engine_settings(config, eos, pad),
        rollout_kind=rollout_kind,
        inputs=inputs,
    )
