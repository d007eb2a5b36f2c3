"""value.privileged_critic.placement with the tiny ChatML tokenizer: the exact critic token layout of each placement,
the policy's tokens unchanged and in order around the note."""

from pathlib import Path
from typing import Any

import pytest
import torch
from ppo_fakes import trajectory_of_ids

from asyncppo.config.models import PrivilegedCriticConfig, PrivilegedFieldConfig
from asyncppo.models.tokenizer import load_tokenizer
from asyncppo.trainer.privileged_critic import PrivilegedCritic, critic_batch, critic_layout
from asyncppo.types import MessageSpan, Role, Trajectory, collate_trajectories

PAD = 0
TEMPLATE = "[reference, for the critic only]\n{answer}"
NOTE = "[reference, for the critic only]\n<reference>\n<answer>\n3\n</answer>\n</reference>"
SYSTEM = "<|im_start|>system\nBe brief.<|im_end|>\n"
USER = "<|im_start|>user\nWhat is 2+1?<|im_end|>\n<|im_start|>assistant\n"
RESPONSE = "It is 3.<|im_end|>"


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path) -> Any:
    return load_tokenizer(tiny_dir)


def _critic(tokenizer: Any, placement: str) -> PrivilegedCritic:
    settings = PrivilegedCriticConfig.model_validate(
        {
            "enabled": True,
            "placement": placement,
            "template": TEMPLATE,
            "fields": [PrivilegedFieldConfig(name="answer")],
        }
    )
    return PrivilegedCritic(tokenizer, settings, PAD)


def _trajectory(tokenizer: Any, prompt: list[tuple[Role, str]]) -> Trajectory:
    messages = [*prompt, ("assistant", RESPONSE)]
    ids = [(role, tokenizer.encode(text, add_special_tokens=False)) for role, text in messages]
    return trajectory_of_ids(ids, reward=1.0, group_id=0, task={"answer": "3"})


@pytest.mark.parametrize(
    ("placement", "prompt", "expected"),
    [
        (
            "user_suffix",
            [("system", SYSTEM), ("user", USER)],
            f"{SYSTEM}<|im_start|>user\nWhat is 2+1?\n\n{NOTE}<|im_end|>\n<|im_start|>assistant\n{RESPONSE}",
        ),
        (
            "user_prefix",
            [("system", SYSTEM), ("user", USER)],
            f"{SYSTEM}<|im_start|>user\n{NOTE}\n\nWhat is 2+1?<|im_end|>\n<|im_start|>assistant\n{RESPONSE}",
        ),
        ("system", [("user", USER)], f"<|im_start|>system\n{NOTE}<|im_end|>\n{USER}{RESPONSE}"),
        # No user message to put it in: the note becomes a leading system message.
        (
            "user_suffix",
            [("system", SYSTEM + "<|im_start|>assistant\n")],
            f"<|im_start|>system\n{NOTE}<|im_end|>\n{SYSTEM}<|im_start|>assistant\n{RESPONSE}",
        ),
    ],
)
def test_each_placement_gives_its_critic_layout_and_keeps_the_policy_tokens(
    tokenizer: Any, placement: str, prompt: list[tuple[Role, str]], expected: str
):
    trajectory = _trajectory(tokenizer, prompt)
    prefixes = _critic(tokenizer, placement).prefixes([trajectory])
    batch = collate_trajectories([trajectory], PAD)
    policy_ids = batch.input_ids.clone()
    layout = critic_layout(batch, prefixes)
    critic = critic_batch(batch, layout)
    assert tokenizer.decode(critic.input_ids[0].tolist()) == expected
    # The policy batch is untouched, and its tokens sit in order around the note in the critic copy.
    assert torch.equal(batch.input_ids, policy_ids)
    assert torch.equal(layout.to_policy(critic.input_ids), policy_ids)
    inserted = len(prefixes.token_ids[0])
    response = len(trajectory.token_ids) - trajectory.prompt_length
    assert critic.input_ids[0, -response:].tolist() == trajectory.token_ids[-response:]
    assert critic.token_mask[0].tolist() == [0.0] * (trajectory.prompt_length + inserted) + [1.0] * response
    assert int(critic.prompt_lengths[0]) == trajectory.prompt_length + inserted
    spans = critic.message_logs[0]
    assert sum(span.num_tokens for span in spans) == len(trajectory.token_ids) + inserted
    assert spans[-1] == MessageSpan("assistant", response)
    if prefixes.positions == (0,):
        assert spans[0] == MessageSpan("system", inserted)
    else:  # the note joined the user message it was put in
        assert spans[-2].role == "user" and spans[-2].num_tokens == trajectory.message_log[-2].num_tokens + inserted


def test_the_note_goes_into_the_last_user_message_of_the_prompt(tokenizer: Any):
    first_turn = "<|im_start|>user\nHi.<|im_end|>\n"
    trajectory = _trajectory(tokenizer, [("user", first_turn), ("user", USER)])
    prefixes = _critic(tokenizer, "user_suffix").prefixes([trajectory])
    batch = collate_trajectories([trajectory], PAD)
    text = tokenizer.decode(critic_layout(batch, prefixes).input_ids[0].tolist())
    assert text.startswith(f"{first_turn}<|im_start|>user\nWhat is 2+1?\n\n{NOTE}<|im_end|>")
