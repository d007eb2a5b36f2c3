"""Optimizer and learning-rate schedule conversion: NeMo-RL's torch (DTensor) and Megatron shapes to asyncppo's.

asyncppo trains with AdamW and one schedule `{name: constant | linear | cosine, warmup_steps, total_steps,
min_lr_ratio}` (linear warmup from 0, then the decay; total_steps counts the warmup). NeMo-RL's DTensor configs
write a torch optimizer as `{name, kwargs}` and the schedule as a list of torch schedulers joined by
`milestones` (a SequentialLR); Megatron configs write `megatron_cfg.optimizer` / `megatron_cfg.scheduler`. Shapes
the asyncppo schedule cannot express are refused with what was found.
"""

from typing import Any, cast

from asyncppo.config.nemo_rl.rules import Outcome, Source, mapped

TORCH_SCHEDULER_PREFIX = "torch.optim.lr_scheduler."
ADAMW_NAMES = ("torch.optim.AdamW", "AdamW")
# torch's own defaults for the kwargs a config may leave out.
_LINEAR_DEFAULTS = {"start_factor": 1 / 3, "end_factor": 1.0, "total_iters": 5}
_CONSTANT_DEFAULTS = {"factor": 1 / 3, "total_iters": 5}


CONSTANT_SCHEDULE = {"name": "constant", "warmup_steps": 0}
"""asyncppo's default schedule, as a converted schedule section."""


class SchedulerRefused(ValueError):
    """A schedule asyncppo's scheduler cannot express; the message says what was found."""


def torch_optimizer_name(_key: str, value: Any, source: Source) -> Outcome:
    """`optimizer.name`: AdamW is asyncppo's optimizer; Adam without weight decay is the same update."""
    if value in ADAMW_NAMES:
        return Outcome("neutral", "asyncppo's optimizer is AdamW")
    section = _key.rpartition(".optimizer.")[0]
    decay = source.get(f"{section}.optimizer.kwargs.weight_decay", 0)
    if value in ("torch.optim.Adam", "Adam") and not decay:
        return Outcome("neutral", "Adam without weight decay is AdamW's update")
    return Outcome("refused", f"{value!r}: asyncppo trains with AdamW only (torch.optim.AdamW)")


def scheduler_outcome(key: str, value: Any, source: Source, target_section: str) -> Outcome:
    """The whole `scheduler` list (one table row) as `<target_section>.scheduler`."""
    if value is None:
        if source.enabled(f"{key.rpartition('.')[0]}.megatron_cfg"):
            return Outcome("backend", "megatron_cfg.scheduler takes its role (mapped from there)")
        return Outcome("neutral", f"no schedule: {target_section}.scheduler.name=constant")
    section = key.rpartition(".")[0]
    lr = source.get(f"{section}.optimizer.kwargs.lr")
    try:
        schedule, note = convert_torch_schedule(value, lr)
    except SchedulerRefused as error:
        return Outcome("refused", str(error))
    except (TypeError, ValueError) as error:  # int("x"), "x" < 1.0: a kwarg that is not a number
        return Outcome("refused", f"{value!r}: scheduler kwargs must be numbers ({error})")
    if schedule == CONSTANT_SCHEDULE:
        return Outcome("neutral", f"a constant learning rate: asyncppo's default {target_section}.scheduler")
    return mapped(f"{target_section}.scheduler", schedule, note)


def convert_torch_schedule(entries: Any, lr: Any) -> tuple[dict[str, Any], str]:
    """A NeMo-RL scheduler list -> (asyncppo scheduler section, a note on the conversion)."""
    listed: list[Any] = cast(list[Any], entries) if isinstance(entries, list) else [entries]
    if not all(isinstance(entry, dict) for entry in listed):
        raise SchedulerRefused(f"expected a list of {{name, kwargs}} schedulers, got {entries!r}")
    as_dicts = [cast(dict[str, Any], entry) for entry in listed]
    schedulers = [entry for entry in as_dicts if "name" in entry]
    milestones: list[Any] = [entry["milestones"] for entry in as_dicts if "milestones" in entry]
    # `milestones: []` beside a single scheduler joins nothing: NeMo-RL's stock constant schedule writes it.
    if len(schedulers) == 1 and milestones in ([], [[]]):
        return _single(schedulers[0], lr, warmup=0)
    if len(schedulers) == 2 and len(milestones) == 1 and isinstance(milestones[0], list):
        boundaries = cast(list[Any], milestones[0])
        if len(boundaries) == 1:
            warmup_steps, start_factor = _warmup(schedulers[0], boundaries[0])
            schedule, note = _single(schedulers[1], lr, warmup=warmup_steps)
            warmup_note = f"warmup {warmup_steps} steps from 0, NeMo-RL's from start_factor={start_factor} x lr"
            return schedule, f"{warmup_note}; {note}" if note else warmup_note
    names = [str(entry.get("name")) for entry in schedulers]
    raise SchedulerRefused(
        f"schedulers {names} with milestones {milestones}: asyncppo's schedule is one warmup (LinearLR up to factor "
        "1, with milestones [its total_iters]) followed by one ConstantLR, LinearLR or CosineAnnealingLR"
    )


def _kwargs(entry: dict[str, Any], defaults: dict[str, float]) -> dict[str, Any]:
    """The scheduler's kwargs over torch's defaults."""
    given: Any = entry.get("kwargs") or {}
    if not isinstance(given, dict):
        raise SchedulerRefused(f"scheduler {entry.get('name')!r}: kwargs must be a mapping, got {given!r}")
    return {**defaults, **cast(dict[str, Any], given)}


def _warmup(entry: dict[str, Any], milestone: Any) -> tuple[int, float]:
    """(warmup steps, start factor) of a LinearLR warmup that ends at factor 1 at the milestone."""
    name = str(entry.get("name", "")).removeprefix(TORCH_SCHEDULER_PREFIX)
    kwargs = _kwargs(entry, _LINEAR_DEFAULTS)
    if name != "LinearLR" or kwargs["end_factor"] != 1.0 or kwargs["total_iters"] != milestone:
        raise SchedulerRefused(
            f"first scheduler {entry.get('name')!r} with {kwargs} and milestone {milestone}: expected a LinearLR "
            "warmup ending at end_factor 1.0 whose total_iters equals the milestone"
        )
    return int(kwargs["total_iters"]), float(kwargs["start_factor"])


def _single(entry: dict[str, Any], lr: Any, warmup: int) -> tuple[dict[str, Any], str]:
    """One torch scheduler after `warmup` steps -> (asyncppo schedule, note)."""
    name = str(entry.get("name", "")).removeprefix(TORCH_SCHEDULER_PREFIX)
    if name == "ConstantLR":
        kwargs = _kwargs(entry, _CONSTANT_DEFAULTS)
        if kwargs["factor"] != 1.0:
            raise SchedulerRefused(f"ConstantLR factor {kwargs['factor']}: asyncppo scales the peak lr by 1 only")
        return {"name": "constant", "warmup_steps": warmup}, ""
    if name == "LinearLR":
        kwargs = _kwargs(entry, _LINEAR_DEFAULTS)
        if warmup == 0 and kwargs["end_factor"] == 1.0 and kwargs["start_factor"] < 1.0:
            steps = int(kwargs["total_iters"])
            note = f"warmup {steps} steps from 0, NeMo-RL's from start_factor={kwargs['start_factor']} x lr"
            return {"name": "constant", "warmup_steps": steps}, note
        if kwargs["start_factor"] != 1.0:
            raise SchedulerRefused(f"LinearLR decay from start_factor {kwargs['start_factor']}: expected 1.0")
        total = warmup + int(kwargs["total_iters"])
        return {
            "name": "linear",
            "warmup_steps": warmup,
            "total_steps": total,
            "min_lr_ratio": kwargs["end_factor"],
        }, ""
    if name == "CosineAnnealingLR":
        kwargs = _kwargs(entry, {"eta_min": 0.0})
        if "T_max" not in kwargs:
            raise SchedulerRefused("CosineAnnealingLR without kwargs.T_max")
        if not isinstance(lr, int | float) or lr <= 0:
            raise SchedulerRefused(
                f"CosineAnnealingLR eta_min needs optimizer.kwargs.lr to become a ratio (got {lr!r})"
            )
        schedule = {
            "name": "cosine",
            "warmup_steps": warmup,
            "total_steps": warmup + int(kwargs["T_max"]),
            "min_lr_ratio": float(kwargs["eta_min"]) / lr,
        }
        return schedule, "min_lr_ratio = eta_min / lr; total_steps = warmup + T_max"
    raise SchedulerRefused(f"scheduler {entry.get('name')!r}: expected ConstantLR, LinearLR or CosineAnnealingLR")


MEGATRON_OPTIMIZER_KEYS = {"lr": "lr", "weight_decay": "weight_decay", "adam_eps": "eps"}


def megatron_optimizer(key: str, value: Any, source: Source, target_section: str) -> Outcome:
    """`megatron_cfg.optimizer.*` (only when megatron_cfg.enabled) -> `<target_section>.optimizer` / scheduler."""
    config = key.partition(".optimizer.")[0]
    name = key.rpartition(".")[2]
    if not source.enabled(config):
        return Outcome("backend", "megatron_cfg.enabled is false: the DTensor optimizer section is used")
    target = f"{target_section}.optimizer"
    if name in MEGATRON_OPTIMIZER_KEYS:
        return mapped(f"{target}.{MEGATRON_OPTIMIZER_KEYS[name]}", value)
    if name in ("adam_beta1", "adam_beta2"):
        betas = [source.get(f"{config}.optimizer.adam_beta1", 0.9), source.get(f"{config}.optimizer.adam_beta2", 0.999)]
        return mapped(f"{target}.betas", betas, "with its sibling adam beta")
    if name == "optimizer":
        if value == "adam":
            return Outcome("neutral", "Megatron's adam decouples weight decay: asyncppo's AdamW")
        return Outcome("refused", f"{value!r}: asyncppo trains with AdamW only (megatron optimizer: adam)")
    if name == "min_lr":
        lr = source.get(f"{config}.optimizer.lr")
        if not isinstance(lr, int | float) or lr <= 0 or not isinstance(value, int | float):
            return Outcome("refused", f"{value!r}: min_lr and megatron_cfg.optimizer.lr must be numbers (a ratio)")
        return mapped(f"{target_section}.scheduler.min_lr_ratio", value / lr, "min_lr / lr")
    return Outcome("backend", f"Megatron optimizer internals; asyncppo's AdamW is set by {target}")


MEGATRON_DECAY_STYLES = {"constant": "constant", "linear": "linear", "cosine": "cosine"}


def megatron_scheduler(key: str, value: Any, source: Source, target_section: str) -> Outcome:
    """`megatron_cfg.scheduler.*` (only when megatron_cfg.enabled) -> `<target_section>.scheduler`."""
    config = key.partition(".scheduler.")[0]
    name = key.rpartition(".")[2]
    target = f"{target_section}.scheduler"
    if not source.enabled(config):
        return Outcome("backend", "megatron_cfg.enabled is false: the DTensor scheduler list is used")
    if name == "lr_decay_style":
        if not isinstance(value, str) or value not in MEGATRON_DECAY_STYLES:
            return Outcome("refused", f"{value!r}: asyncppo decays constant, linear or cosine")
        return mapped(f"{target}.name", MEGATRON_DECAY_STYLES[value])
    if name == "lr_warmup_iters":
        return mapped(f"{target}.warmup_steps", value, "warmup from 0")
    if name == "lr_decay_iters":
        return mapped(f"{target}.total_steps", value)
    return Outcome("backend", f"Megatron scheduler internals; asyncppo's schedule is {target}")
