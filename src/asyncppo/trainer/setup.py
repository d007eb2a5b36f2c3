"""A run's inputs, resolved once from its config: every command that loads a model starts here.

    RunConfig --resolve_setup--> RunSetup: device, model directories (tiny: and demo: names built into the
                                 cache, Hub ids found in or fetched into the Hugging Face cache), tokenizer,
                                 the ids that end and pad a generation, engine settings, rollout kind (gym
                                 or single-turn); with data=True (or the pre-flight's result passed in) also
                                 the checked rows and reward function (trainer/preflight.py)

Callers: `asyncppo train` and `asyncppo.train` (api.py, then trainer/build.py `start_run`), `critic collect`
and `critic pretrain` (trainer/critic_*.py), `gym serve` and `bench generate` (cli/), `bench train`
(trainer/train_bench.py). Each takes the RunSetup and does only its own work with it.
"""

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

# huggingface_hub types snapshot_download's user_agent as a bare dict, which strict mode reports as partly unknown.
from huggingface_hub import constants, snapshot_download  # pyright: ignore[reportUnknownVariableType]
from huggingface_hub.errors import LocalEntryNotFoundError
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


def resolve_model_path(model_name: str, key: str = "model.model_name", revision: str | None = None) -> Path:
    """A local model directory: `tiny:<preset>` and `demo:<name>` are built (once) into the cache; a Hub id
    (`org/name`, when no such local path exists) is the snapshot directory of `revision` in the Hugging Face
    cache (`hub_snapshot`)."""
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
    if not path.exists() and HUB_ID.fullmatch(model_name):
        snapshot = hub_snapshot(model_name, revision, key)
        if not (snapshot / "config.json").is_file():
            raise ConfigError([f"{key}: Hub model {model_name!r} has no config.json in its snapshot {snapshot}"])
        return snapshot
    if not (path / "config.json").is_file():
        raise ConfigError([f"{key}: {model_name!r} is not a local Hugging Face model directory (no config.json)"])
    return path


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
"""`org/name`: a model name of this shape that is not an existing local path is looked up on the Hub."""
HUB_MODEL_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken"]
"""What a run loads from a Hub model: configs, safetensors weights, tokenizer files, chat template. Repositories
often also hold the weights in other formats (.bin, .gguf, original checkpoints), which would only cost time."""


def hub_snapshot(repo_id: str, revision: str | None, key: str) -> Path:
    """The cached snapshot directory of Hub model `repo_id` at `revision` (null = main), downloaded into the
    Hugging Face cache first when it is not there and HF_HUB_OFFLINE is unset. ConfigError naming `key`, the id,
    the revision and the cache directory when it is neither cached nor fetchable."""
    shown = f"Hub model {repo_id!r} at revision {revision or constants.DEFAULT_REVISION!r}"
    try:
        return Path(
            snapshot_download(repo_id, revision=revision, allow_patterns=HUB_MODEL_FILES, local_files_only=True)
        )
    except LocalEntryNotFoundError:
        pass  # not cached: fetched below unless offline
    except ValueError as error:  # huggingface_hub's check of the id's characters
        raise ConfigError([f"{key}: {repo_id!r} is not a valid Hub id ({one_line(error)})"]) from None
    missing = f"{key}: {shown} is not in the Hugging Face cache {constants.HF_HUB_CACHE}"
    # Read at call time from huggingface_hub, which reads HF_HUB_OFFLINE once, when it is imported.
    if constants.is_offline_mode():
        raise ConfigError(
            [
                f"{missing} and HF_HUB_OFFLINE=1 forbids downloading it; download it once without HF_HUB_OFFLINE "
                "(e.g. `hf download <id>`), or point HF_HOME / HF_HUB_CACHE at a cache that holds it"
            ]
        )
    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=HUB_MODEL_FILES))
    except (OSError, ValueError) as error:  # huggingface_hub's HTTP and connection errors are OSErrors
        raise ConfigError(
            [f"{missing} and cannot be downloaded ({one_line(error)}); check the id, the revision and the network"]
        ) from None


def one_line(error: BaseException) -> str:
    """An exception as `Type: first line of its message` (Hub errors add lines of hints and request ids)."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


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
        policy's model; None without a critic); Hub ids at model.revision (the policy's and tokenizer's) and
        value.revision. A name that is neither a built name, a local directory nor a cached or fetchable Hub
        model is a ConfigError naming its key, before anything loads."""
        model = config.model
        policy = resolve_model_path(model.model_name, "model.model_name", model.revision)
        tokenizer = (
            resolve_model_path(model.tokenizer, "model.tokenizer", model.revision) if model.tokenizer else policy
        )
        value = None
        if config.value is not None:
            value_name = config.value.model_name
            value = (
                policy
                if value_name is None
                else resolve_model_path(value_name, "value.model_name", config.value.revision)
            )
        return cls(policy=policy, tokenizer=tokenizer, value=value)


def end_and_pad_ids(
    config: RunConfig, tokenizer: PreTrainedTokenizerBase, tokenizer_path: Path
) -> tuple[tuple[int, ...], int]:
    """(ids that end a generation: EOS plus generation.stop_token_ids, pad id: the tokenizer's or EOS); a ConfigError
    for a stop id outside the tokenizer's vocabulary."""

    def token_id(value: object, name: str) -> int:
        if not isinstance(value, int):
            raise ConfigError(
                [f"model.tokenizer: the tokenizer at {tokenizer_path} has {name}={value!r}; generation needs one id"]
            )
        return value

    eos_id = token_id(tokenizer.eos_token_id, "eos_token_id")
    stop_ids: list[int] = list(config.generation.stop_token_ids or [])
    vocab_size = len(tokenizer)
    outside = [stop_id for stop_id in stop_ids if not 0 <= stop_id < vocab_size]
    if outside:
        # An id the model can never sample would never stop a generation: the list is mistyped, or for another model.
        raise ConfigError(
            [
                f"generation.stop_token_ids: {outside[0]} is outside the vocabulary of the tokenizer at "
                f"{tokenizer_path} ({vocab_size} ids: 0 to {vocab_size - 1})"
            ]
        )
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


def resolve_setup(
    config: RunConfig, config_dir: Path | None = None, *, data: bool = False, inputs: CheckedInputs | None = None
) -> RunSetup:
    """Resolve a run's inputs; every mistake found is a ConfigError naming its key.

    The cheap checks come first, so a mistake costs nothing: with `data` the pre-flight (sinks, reward function,
    data files; `config_dir` is searched for the reward module), then the rollout kind and the device; the model
    directories last (a `tiny:` or `demo:` name is built into the cache on first use). `inputs` is the pre-flight's
    result when the caller ran it already (`asyncppo train` does, before torch is imported): it is not run again.
    """
    if inputs is None and data:
        inputs = preflight(config, config_dir)
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
