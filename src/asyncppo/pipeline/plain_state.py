"""Plain-data forms of what the pipeline checkpoints: trajectories and dataset rows.

The TrajectoryBuffer saves its groups and the Collector its pending rows through these, so a checkpoint is
dicts, lists, numbers, strings and tensors only: torch.save writes it and torch.load(weights_only=True) reads
it back without unpickling arbitrary objects, so loading a checkpoint cannot run code.

    Trajectory --trajectory_to_state--> {"token_ids": int64 tensor, ..., "task": plain dict} --torch.save-->
    Trajectory <--trajectory_from_state-- dict <--torch.load(weights_only=True)--
"""

from typing import Any, cast

import torch

from asyncppo.types import MessageSpan, Role, Trajectory

_ROLES: frozenset[str] = frozenset({"system", "user", "assistant", "tool"})


def check_plain_data(value: object, path: str) -> None:
    """Raise ValueError naming `path` unless `value` is JSON-like data (or a tensor) that weights_only loads."""
    if value is None or isinstance(value, str | bool | int | float | torch.Tensor):
        return
    if isinstance(value, list | tuple):
        for index, item in enumerate(cast(list[object], value)):
            check_plain_data(item, f"{path}[{index}]")
        return
    if isinstance(value, dict):
        for key, item in cast(dict[object, object], value).items():
            if not isinstance(key, str | int):
                raise ValueError(f"{path}: key {key!r} of type {type(key).__name__} is not a str or int")
            check_plain_data(item, f"{path}[{key!r}]")
        return
    raise ValueError(
        f"{path} holds a {type(value).__name__}, which a weights_only checkpoint cannot load; "
        "rows and trajectory task fields must be plain data (str, int, float, bool, None, list, dict, tensor)"
    )


def trajectory_to_state(trajectory: Trajectory) -> dict[str, Any]:
    """Every field of the trajectory as plain data; logprobs stay float64 so the round trip is exact."""
    check_plain_data(trajectory.task, f"trajectory of group {trajectory.group_id}: task")
    return {
        "token_ids": torch.tensor(trajectory.token_ids, dtype=torch.int64),
        "loss_mask": torch.tensor(trajectory.loss_mask, dtype=torch.int64),
        "generation_logprobs": torch.tensor(trajectory.generation_logprobs, dtype=torch.float64),
        "prompt_length": trajectory.prompt_length,
        "message_log": [[span.role, span.num_tokens] for span in trajectory.message_log],
        "reward": trajectory.reward,
        "group_id": trajectory.group_id,
        "sample_index": trajectory.sample_index,
        "policy_version": trajectory.policy_version,
        "last_policy_version": trajectory.last_policy_version,
        "truncated": trajectory.truncated,
        "mask_sample": trajectory.mask_sample,
        "reward_components": dict(trajectory.reward_components),
        "task": trajectory.task,
        "invalid_tool_call": trajectory.invalid_tool_call,
    }


def trajectory_from_state(state: dict[str, Any]) -> Trajectory:
    """The inverse of trajectory_to_state (Trajectory's own checks run again)."""
    message_log: list[MessageSpan] = []
    for role, num_tokens in state["message_log"]:
        if role not in _ROLES:
            raise ValueError(f"trajectory of group {state['group_id']}: unknown message role {role!r}")
        message_log.append(MessageSpan(role=cast(Role, role), num_tokens=int(num_tokens)))
    return Trajectory(
        token_ids=[int(token) for token in state["token_ids"].tolist()],
        loss_mask=[int(flag) for flag in state["loss_mask"].tolist()],
        generation_logprobs=[float(logprob) for logprob in state["generation_logprobs"].tolist()],
        prompt_length=int(state["prompt_length"]),
        message_log=message_log,
        reward=float(state["reward"]),
        group_id=int(state["group_id"]),
        sample_index=int(state["sample_index"]),
        policy_version=int(state["policy_version"]),
        last_policy_version=int(state["last_policy_version"]),
        truncated=bool(state["truncated"]),
        mask_sample=bool(state["mask_sample"]),
        reward_components={str(key): float(value) for key, value in state["reward_components"].items()},
        task=dict(state["task"]),
        # Absent from checkpoints written before the flag existed.
        invalid_tool_call=bool(state.get("invalid_tool_call", False)),
    )
