"""The privileged critic with the tiny tokenizer: prefixes from task fields, the critic layout, and `ppo_step` with
fake models that record what they receive (token and turn GAE, residual and absolute targets)."""

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from ppo_fakes import CallLog, FakePolicy, FakeValue, trajectory_of_ids

from asyncppo.config.models import PrivilegedCriticConfig, PrivilegedFieldConfig
from asyncppo.models.tokenizer import load_tokenizer
from asyncppo.trainer.ppo_step import StepSettings, ppo_step
from asyncppo.trainer.privileged_critic import CriticPrefixes, PrivilegedCritic, critic_batch, critic_layout
from asyncppo.types import MessageSpan, Role, TrainBatch, Trajectory, collate_trajectories
from ppo_settings import gae, plain_step_settings, turn_gae

PAD = 0


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path) -> Any:
    return load_tokenizer(tiny_dir)


@pytest.fixture
def privileged(tokenizer: Any) -> PrivilegedCritic:
    fields = [
        PrivilegedFieldConfig(name="answer"),
        PrivilegedFieldConfig(name="meta.tests", title="tests", max_tokens=40),
    ]
    settings = PrivilegedCriticConfig(enabled=True, placement="system", fields=fields, max_total_tokens=64)
    return PrivilegedCritic(tokenizer, settings, PAD)


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _trajectory(
    tokenizer: Any, group_id: int, sample_index: int, reward: float, task: dict[str, Any], turns: int = 1
) -> Trajectory:
    """A user prompt, then `turns` assistant messages separated by tool messages (lengths vary per sample)."""
    messages: list[tuple[Role, list[int]]] = [("user", _ids(tokenizer, f"<|im_start|>user\nWhat is {group_id}+1?"))]
    for turn in range(turns):
        if turn:
            messages.append(("tool", _ids(tokenizer, "<|im_end|>\n<|im_start|>tool\nok<|im_end|>\n")))
        answer = "1" * (sample_index + turn + 1)
        messages.append(("assistant", _ids(tokenizer, f"The answer is {answer}.<|im_end|>")))
    return trajectory_of_ids(messages, reward, group_id, sample_index, task=task)


def _group_batch(tokenizer: Any, turns: int = 1, tasks: list[dict[str, Any]] | None = None) -> list[Trajectory]:
    """Two prompt groups of two rollouts with mixed rewards."""
    tasks = tasks or [{"answer": "2", "meta": {"tests": ["t(1)", "t(2)"]}}, {"answer": "3"}]
    rewards = [[1.0, 0.0], [0.5, 0.0]]
    return [
        _trajectory(tokenizer, group, sample, rewards[group][sample], tasks[group], turns)
        for group in range(2)
        for sample in range(2)
    ]


def critic_values(batch: TrainBatch) -> torch.Tensor:
    """V = 0.01 * token id: the same number for a token in either layout, so a correct move changes nothing."""
    return 0.01 * batch.input_ids.float() * batch.attention_mask


def _settings(estimator: str, residual: bool, privileged: bool) -> StepSettings:
    if estimator == "gae":
        advantage = gae(normalize_advantages=True, residual_baseline=residual, gae_lambda=0.95)
    else:
        advantage = turn_gae(normalize_advantages=True, residual_baseline=residual, turn_gae_lambda_policy=0.9)
    return plain_step_settings(advantage, privileged_critic=privileged)


# --- prefixes ----------------------------------------------------------------------------------------------------


def test_block_is_a_system_message_identical_across_the_siblings_of_a_group(
    tokenizer: Any, privileged: PrivilegedCritic
):
    prefixes = privileged.prefixes(_group_batch(tokenizer))
    ids = prefixes.token_ids
    assert ids[0] == ids[1] and ids[2] == ids[3] and ids[0] != ids[2]
    text = tokenizer.decode(list(ids[0]))
    assert text == (
        "<|im_start|>system\n<reference>\n<answer>\n2\n</answer>\n<tests>\nt(1)\nt(2)\n</tests>\n"
        "</reference><|im_end|>\n"
    )
    assert (
        tokenizer.decode(list(ids[2]))
        == "<|im_start|>system\n<reference>\n<answer>\n3\n</answer>\n</reference><|im_end|>\n"
    )


def test_response_tokens_stay_verbatim_after_the_prefix_in_the_critic_layout(
    tokenizer: Any, privileged: PrivilegedCritic
):
    trajectories = _group_batch(tokenizer, turns=2)
    prefixes = privileged.prefixes(trajectories)
    batch = collate_trajectories(trajectories, PAD)
    critic = critic_batch(batch, critic_layout(batch, prefixes))
    for row, (trajectory, prefix) in enumerate(zip(trajectories, prefixes.token_ids, strict=True)):
        start, end = len(prefix), len(prefix) + len(trajectory.token_ids)
        assert critic.input_ids[row, :start].tolist() == list(prefix)
        assert critic.input_ids[row, start:end].tolist() == trajectory.token_ids
        assert critic.token_mask[row, start:end].tolist() == [float(m) for m in trajectory.loss_mask]
        assert int(critic.attention_mask[row].sum()) == end and critic.token_mask[row, :start].sum() == 0
        assert int(critic.prompt_lengths[row]) == start + trajectory.prompt_length
        assert critic.message_logs[row][0] == MessageSpan("system", start)
        assert sum(span.num_tokens for span in critic.message_logs[row]) == end
    assert torch.equal(critic.rewards, batch.rewards) and torch.equal(critic.group_ids, batch.group_ids)


def test_a_batch_without_any_privileged_field_is_an_error_naming_the_fields(
    tokenizer: Any, privileged: PrivilegedCritic
):
    trajectories = _group_batch(tokenizer, tasks=[{"question": "q"}, {}])
    with pytest.raises(ValueError, match=r"\['answer', 'meta.tests'\].*task keys: \['question'\]"):
        privileged.prefixes(trajectories)


def test_rows_without_privilege_get_no_block_and_one_warning(
    tokenizer: Any, privileged: PrivilegedCritic, caplog: pytest.LogCaptureFixture
):
    trajectories = _group_batch(tokenizer, tasks=[{"answer": "2"}, {"question": "q"}])
    with caplog.at_level(logging.WARNING, logger="asyncppo.trainer.privileged_critic"):
        prefixes = privileged.prefixes(trajectories)
    assert [len(ids) > 0 for ids in prefixes.token_ids] == [True, True, False, False]
    assert len(caplog.records) == 1 and "2 of 4 trajectories" in caplog.records[0].getMessage()
    assert prefixes.metrics["privilege/n_rows_without_privilege"] == 2.0


def test_privilege_metrics_report_truncation_per_field(tokenizer: Any):
    fields = [PrivilegedFieldConfig(name="answer"), PrivilegedFieldConfig(name="meta.tests", title="tests")]
    critic = PrivilegedCritic(tokenizer, PrivilegedCriticConfig(enabled=True, fields=fields, max_total_tokens=24), PAD)
    long_tests = {"answer": "2", "meta": {"tests": [f"assert f({i}) == {i + 1}" for i in range(10)]}}
    prefixes = critic.prefixes(_group_batch(tokenizer, tasks=[long_tests, {"answer": "3"}]))
    metrics = prefixes.metrics
    lengths = [len(ids) for ids in prefixes.token_ids]
    assert metrics["privilege/frac_truncated"] == 0.5  # group 0's tests are cut, group 1 has nothing to cut
    assert metrics["privilege/frac_truncated_tests"] == 0.5 and metrics["privilege/frac_truncated_answer"] == 0.0
    assert metrics["privilege/block_tokens_mean"] == sum(lengths) / 4
    assert metrics["privilege/block_tokens_max"] == max(lengths)
    assert metrics["privilege/dropped_tokens_mean"] > 0 and metrics["privilege/n_rows_without_privilege"] == 0.0
    assert "\n... [truncated]\n</tests>" in tokenizer.decode(list(prefixes.token_ids[0]))


# --- ppo_step ----------------------------------------------------------------------------------------------------


def _run(tokenizer: Any, privileged: PrivilegedCritic | None, estimator: str, residual: bool):
    """The step's output, the batches the policy trained on, the critic's calls by name, and the prefixes."""
    trajectories = _group_batch(tokenizer, turns=2 if estimator == "turn_gae" else 1)
    batch = collate_trajectories(trajectories, PAD)
    prefixes = privileged.prefixes(trajectories) if privileged is not None else None
    log = CallLog()
    settings = _settings(estimator, residual, privileged=prefixes is not None)
    output = ppo_step(settings, FakePolicy(log), FakeValue(log, critic_values), batch, step=0, critic_prefixes=prefixes)
    assert log.of("value.evaluate") == []  # these steps log no post-update critic metrics
    return output, [call.batch for call in log.of("policy.train")], log, prefixes


@pytest.mark.parametrize("estimator", ["gae", "turn_gae"])
@pytest.mark.parametrize("residual", [True, False])
def test_privilege_composes_with_token_and_turn_gae_and_both_target_spaces(
    tokenizer: Any, privileged: PrivilegedCritic, estimator: str, residual: bool
):
    plain, plain_policy_batches, plain_value, _ = _run(tokenizer, None, estimator, residual)
    output, policy_batches, value, prefixes = _run(tokenizer, privileged, estimator, residual)
    assert prefixes is not None
    # The fake critic ignores the prefix, so every policy-side number must match the plain run exactly.
    for key in ("values", "advantages", "returns", "critic_mask", "critic_sample_mask"):
        assert torch.equal(getattr(output.batch, key), getattr(plain.batch, key)), key
    assert torch.equal(policy_batches[0].input_ids, plain_policy_batches[0].input_ids)  # the policy sees no block
    assert output.metrics["critic/explained_var"] == plain.metrics["critic/explained_var"]

    trained, plain_trained = value.of("value.train")[0].batch, plain_value.of("value.train")[0].batch
    offsets, plain_offsets = value.of("value.train")[0].offsets, plain_value.of("value.train")[0].offsets
    assert offsets is not None and plain_offsets is not None
    layout = critic_layout(output.batch, prefixes)
    assert torch.equal(trained.input_ids, layout.input_ids)
    # Returns and the critic mask moved to the critic layout; [B] offsets and masks unchanged, rows in order.
    assert torch.equal(layout.to_policy(trained.returns), plain_trained.returns)
    assert torch.equal(layout.to_policy(trained.critic_mask), plain_trained.critic_mask)
    assert all(torch.equal(a, b) for a, b in zip(offsets, plain_offsets, strict=True))
    assert torch.equal(trained.critic_sample_mask, plain_trained.critic_sample_mask)
    # Value clipping reads the values the critic produced in its own layout.
    assert torch.equal(trained.values, critic_values(trained))
    assert residual == any(offset.abs().sum() > 0 for offset in offsets[:1])


@pytest.mark.parametrize("estimator", ["gae", "turn_gae"])
def test_the_block_precedes_every_supervised_token(tokenizer: Any, privileged: PrivilegedCritic, estimator: str):
    _, _, value, prefixes = _run(tokenizer, privileged, estimator, residual=True)
    assert prefixes is not None
    trained = value.of("value.train")[0].batch
    assert trained.critic_mask is not None
    for row, prefix in enumerate(prefixes.token_ids):
        supervised = trained.critic_mask[row].nonzero().flatten()
        assert len(supervised) > 0 and int(supervised.min()) >= len(prefix) > 0


def test_turn_anchors_survive_into_the_critic_layout(tokenizer: Any, privileged: PrivilegedCritic):
    output, _, value, prefixes = _run(tokenizer, privileged, "turn_gae", residual=True)
    assert prefixes is not None
    trained = value.of("value.train")[0].batch
    for row, prefix in enumerate(prefixes.token_ids):
        policy_anchors = output.batch.critic_mask[row].nonzero().flatten()
        critic_anchors = trained.critic_mask[row].nonzero().flatten()
        assert len(policy_anchors) == 2  # two assistant turns, supervised at their first token only
        assert torch.equal(critic_anchors, policy_anchors + len(prefix))
        # The anchor's token is the first token of its turn in both layouts.
        assert torch.equal(trained.input_ids[row, critic_anchors], output.batch.input_ids[row, policy_anchors])


def test_step_reports_privilege_metrics_and_scores_the_critic_layout(tokenizer: Any, privileged: PrivilegedCritic):
    output, _, value, prefixes = _run(tokenizer, privileged, "gae", residual=False)
    assert prefixes is not None
    assert {key: output.metrics[key] for key in prefixes.metrics} == prefixes.metrics
    assert value.of("value.values")[0].batch.seq_len == max(
        len(p) + int(n) for p, n in zip(prefixes.token_ids, output.batch.attention_mask.sum(1), strict=True)
    )


def test_prefixes_and_settings_must_agree(tokenizer: Any, privileged: PrivilegedCritic):
    trajectories = _group_batch(tokenizer)
    batch = collate_trajectories(trajectories, PAD)
    log = CallLog()
    policy, value = FakePolicy(log), FakeValue(log, critic_values)
    with pytest.raises(ValueError, match="privileged critic is on but critic_prefixes was not given"):
        ppo_step(_settings("gae", True, privileged=True), policy, value, batch, 0)
    prefixes = privileged.prefixes(trajectories)
    with pytest.raises(ValueError, match="privileged critic is off but critic_prefixes was given"):
        ppo_step(_settings("gae", True, privileged=False), policy, value, batch, 0, critic_prefixes=prefixes)
    short = CriticPrefixes(prefixes.token_ids[:3], PAD, {})
    with pytest.raises(ValueError, match="3 critic prefixes for a batch of 4 rows"):
        ppo_step(_settings("gae", True, privileged=True), policy, value, batch, 0, critic_prefixes=short)
