"""The critic inside the real `ppo_step`: residual and absolute critics give the policy the same advantages,
turn mode supervises anchors only, the documented order and count of critic and policy passes, pre- vs
post-update critic metrics, critic warm-up, homogeneous-group weighting and mask_sample.

The models are fakes (`ppo_fakes`) that return fixed tensors and log a snapshot of every batch they receive;
settings come from a small config tree through `builders.step_settings`. Shapes: B rows, S positions.
"""

import dataclasses
from typing import Any

import pytest
import torch
from ppo_fakes import (
    GAE,
    POST_UPDATE_METRICS,
    TURN_GAE,
    CallLog,
    FakePolicy,
    FakeValue,
    collate,
    pass_metrics,
    settings_from_config,
    single_turn,
    trajectory,
)

from asyncppo.trainer.ppo_step import StepOutput, StepSettings, average_metrics, ppo_step
from asyncppo.types import TrainBatch


def _run(settings: StepSettings, batch: TrainBatch, values: torch.Tensor, step: int = 0) -> tuple[StepOutput, CallLog]:
    log = CallLog()
    output = ppo_step(settings, FakePolicy(log), FakeValue(log, values), batch, step)
    return output, log


def _only(log: CallLog, name: str) -> TrainBatch:
    """The batch of the first `name` call (every critic / policy pass gets the same one)."""
    calls = log.of(name)
    assert calls, f"no {name} call"
    return calls[0].batch


def _row_constant(per_row: list[float], seq_len: int) -> torch.Tensor:
    return torch.tensor(per_row)[:, None].expand(len(per_row), seq_len).clone()


def _close(actual: torch.Tensor, expected: torch.Tensor | list[Any], atol: float = 1e-6) -> None:
    torch.testing.assert_close(actual.float(), torch.as_tensor(expected, dtype=torch.float32), atol=atol, rtol=0)


# --- 1. residual vs absolute critic ------------------------------------------------------------------------------

# Two prompt groups, multi-turn rows with tool messages (token GAE carries over the masked tool tokens).
MIXED_REWARDS = [1.0, 0.0, 0.5, 0.0, 1.0]
MIXED_GROUPS = [0, 0, 0, 1, 1]
# Leave-one-out B_i = (sum of the group's rewards - R_i) / (|g| - 1):
# group 0 (1, 0, 0.5) -> (0.5/2, 1.5/2, 1/2); group 1 (0, 1) -> (1, 0).
MIXED_BASELINE = [0.25, 0.75, 0.5, 1.0, 0.0]


def _mixed_batch() -> TrainBatch:
    logs: list[list[Any]] = [
        [("user", 3), ("assistant", 2), ("tool", 2), ("assistant", 3)],
        [("user", 3), ("assistant", 4)],
        [("user", 3), ("assistant", 1), ("tool", 1), ("assistant", 2)],
        [("user", 2), ("assistant", 3), ("tool", 1), ("assistant", 1)],
        [("user", 2), ("assistant", 5)],
    ]
    return collate(
        [
            trajectory(log, reward, group, sample)
            for sample, (log, reward, group) in enumerate(zip(logs, MIXED_REWARDS, MIXED_GROUPS, strict=True))
        ]
    )


@pytest.mark.parametrize("normalize", [False, True], ids=["raw", "whitened"])
@pytest.mark.parametrize("estimator", [{**GAE, "gae_lambda": 0.95}, TURN_GAE], ids=["gae", "turn_gae"])
def test_residual_critic_outputting_v_minus_b_gives_the_policy_the_absolute_advantages(
    estimator: dict[str, Any], normalize: bool
) -> None:
    batch = _mixed_batch()
    absolute_values = 0.3 * torch.randn(batch.input_ids.shape, generator=torch.Generator().manual_seed(3))
    baseline = torch.tensor(MIXED_BASELINE)
    residual_values = absolute_values - baseline[:, None]  # C = V - B: the loop adds B back before GAE
    common = {**estimator, "normalize_advantages": normalize}

    absolute, absolute_log = _run(settings_from_config({**common, "residual_baseline": False}), batch, absolute_values)
    residual, residual_log = _run(settings_from_config({**common, "residual_baseline": True}), batch, residual_values)

    policy_absolute = _only(absolute_log, "policy.train").advantages
    policy_residual = _only(residual_log, "policy.train").advantages
    assert policy_absolute is not None and policy_residual is not None
    assert policy_absolute.abs().sum() > 0.5  # a real comparison, not 0 == 0
    _close(policy_residual, policy_absolute)

    # Offsets move targets between spaces: residual on -> (to_abs, to_res) = (B, 0); off -> (0, -B).
    for log, expected in ((absolute_log, (torch.zeros(5), -baseline)), (residual_log, (baseline, torch.zeros(5)))):
        for call in log.of("value.train"):
            assert call.offsets is not None
            _close(call.offsets[0], expected[0])
            _close(call.offsets[1], expected[1])

    # Same supervision, targets exactly B apart where supervised (and both 0 elsewhere); the critic keeps
    # its own values (V or C) for value clipping.
    critic_absolute = _only(absolute_log, "value.train")
    critic_residual = _only(residual_log, "value.train")
    assert critic_absolute.critic_mask is not None and critic_residual.critic_mask is not None
    assert torch.equal(critic_absolute.critic_mask, critic_residual.critic_mask)
    assert critic_absolute.returns is not None and critic_residual.returns is not None
    _close(critic_absolute.returns - critic_residual.returns, baseline[:, None] * critic_absolute.critic_mask)
    assert critic_absolute.values is not None and critic_residual.values is not None
    _close(critic_absolute.values, absolute_values)
    _close(critic_residual.values, residual_values)

    # The headline pre-update EVs are on fixed spaces, so both arms report the same numbers.
    for key in ("critic/explained_var", "critic/ev_res"):
        assert residual.metrics[key] == pytest.approx(absolute.metrics[key], abs=1e-5)
    assert absolute.metrics["critic/ev_res"] != pytest.approx(absolute.metrics["critic/explained_var"], abs=1e-3)


# --- 2. what the critic is supervised on -----------------------------------------------------------------------

# Positions of the four rows (S = 10); anchors = first token of each assistant message:
#   row 0  u u u a a t t a a a     anchors 3, 7      R = 1  group 0
#   row 1  u u a a a a             anchor  2         R = 0  group 0
#   row 2  u u u a t a t t a a     anchors 3, 5, 8   R = 1  group 1
#   row 3  u u a a t a             anchors 2, 5      R = 0  group 1, mask_sample
TURN_LOGS: list[list[Any]] = [
    [("user", 3), ("assistant", 2), ("tool", 2), ("assistant", 3)],
    [("user", 2), ("assistant", 4)],
    [("user", 3), ("assistant", 1), ("tool", 1), ("assistant", 1), ("tool", 2), ("assistant", 2)],
    [("user", 2), ("assistant", 2), ("tool", 1), ("assistant", 1)],
]
ANCHORS = [
    [0, 0, 0, 1, 0, 0, 0, 1, 0, 0],
    [0, 0, 1, 0, 0, 0, 0, 0, 0, 0],
    [0, 0, 0, 1, 0, 1, 0, 0, 1, 0],
    [0, 0, 1, 0, 0, 1, 0, 0, 0, 0],
]
RESPONSE = [
    [0, 0, 0, 1, 1, 0, 0, 1, 1, 1],
    [0, 0, 1, 1, 1, 1, 0, 0, 0, 0],
    [0, 0, 0, 1, 0, 1, 0, 0, 1, 1],
    [0, 0, 1, 1, 0, 1, 0, 0, 0, 0],
]
TURN_REWARDS = [1.0, 0.0, 1.0, 0.0]


def _turn_batch() -> TrainBatch:
    rewards, groups = TURN_REWARDS, [0, 0, 1, 1]
    return collate(
        [trajectory(log, rewards[row], groups[row], row % 2, mask_sample=row == 3) for row, log in enumerate(TURN_LOGS)]
    )


def _position_values(batch: TrainBatch) -> torch.Tensor:
    """V(state before token t) = 0.1 t on every row."""
    return 0.1 * torch.arange(batch.seq_len, dtype=torch.float32).expand(len(batch), batch.seq_len).clone()


def _run_turn_batch(estimator: dict[str, Any]) -> tuple[StepOutput, CallLog, TrainBatch]:
    """The turn batch through a step with V = 0.1 t: the output, the call log and the critic's training batch."""
    batch = _turn_batch()
    output, log = _run(settings_from_config(estimator), batch, _position_values(batch))
    return output, log, _only(log, "value.train")


def test_turn_gae_supervises_the_critic_at_turn_anchors_with_turn_returns() -> None:
    output, log, critic = _run_turn_batch(TURN_GAE)

    assert critic.critic_mask is not None and critic.critic_sample_mask is not None
    _close(critic.critic_mask, ANCHORS)
    _close(critic.critic_sample_mask, [1.0, 1.0, 1.0, 0.0])
    # Where the value loss actually applies: anchors of the unmasked rows, nothing else.
    supervised = critic.critic_mask * critic.critic_sample_mask[:, None]
    _close(supervised, [row if index < 3 else [0] * 10 for index, row in enumerate(ANCHORS)])

    # gamma = 1, lambda_value = 0.5, V(s_k) = 0.1 * anchor_k: G_K = R, G_k = (1 - lambda) V(s_{k+1}) + lambda G_{k+1}.
    #   row 0: G@7 = 1;  G@3 = 0.5*0.7 + 0.5*1 = 0.85        row 1: G@2 = 0
    #   row 2: G@8 = 1;  G@5 = 0.5*0.8 + 0.5*1 = 0.9;  G@3 = 0.5*0.5 + 0.5*0.9 = 0.7
    #   row 3 (masked, its targets are still computed): G@5 = 0;  G@2 = 0.5*0.5 + 0.5*0 = 0.25
    expected_returns = torch.zeros(4, 10)
    for row, position, target in [(0, 3, 0.85), (0, 7, 1.0), (2, 3, 0.7), (2, 5, 0.9), (2, 8, 1.0), (3, 2, 0.25)]:
        expected_returns[row, position] = target
    assert critic.returns is not None
    _close(critic.returns, expected_returns)

    # lambda_policy = 1: A_k = R - V(s_k) on every token of turn k, 0 on tool tokens and on the masked row.
    expected_advantages = torch.tensor(
        [
            [0, 0, 0, 0.7, 0.7, 0, 0, 0.3, 0.3, 0.3],
            [0, 0, -0.2, -0.2, -0.2, -0.2, 0, 0, 0, 0],
            [0, 0, 0, 0.7, 0, 0.5, 0, 0, 0.2, 0.2],
            [0] * 10,
        ]
    )
    policy_batch = _only(log, "policy.train")
    assert policy_batch.advantages is not None
    _close(policy_batch.advantages, expected_advantages)
    assert output.batch.returns is not None
    _close(output.batch.returns, expected_returns)


def test_token_gae_supervises_the_critic_on_every_response_token() -> None:
    _, _, critic = _run_turn_batch(GAE)
    assert critic.critic_mask is not None and critic.returns is not None
    _close(critic.critic_mask, RESPONSE)
    # gamma = lambda = 1: G_t = R on every response token (tool tokens carry nothing), 0 elsewhere.
    _close(critic.returns, torch.tensor(TURN_REWARDS)[:, None] * torch.tensor(RESPONSE))


# --- 3. order and count of the passes; pre- vs post-update metrics -------------------------------------------------

# Four single-turn rows (2 prompt + 2 response tokens), R = (1, 0, 1, 0) in groups (0, 0, 1, 1), and a critic
# that is constant per row: V = (0.8, 0.2, 0.6, 0.4). With gamma = lambda = 1, G = R on every response token.
#   G - V = (0.2, -0.2, 0.4, -0.4), mean 0, Var = (0.04 + 0.04 + 0.16 + 0.16) / 4 = 0.1
#   absolute: Var(G) = 0.25                      -> critic/explained_var = 1 - 0.1 / 0.25 = 0.6
#   residual: B = (0, 1, 0, 1), Var(R - B) = 1    -> critic/ev_res        = 1 - 0.1 / 1    = 0.9
ORDER_VALUES = [0.8, 0.2, 0.6, 0.4]


def _order_batch() -> TrainBatch:
    rewards, groups = [1.0, 0.0, 1.0, 0.0], [0, 0, 1, 1]
    return collate([single_turn(2, 2, rewards[row], groups[row], row % 2) for row in range(4)])


@pytest.mark.parametrize(("ppo_epochs", "critic_ppo_epochs", "critic_passes"), [(2, 3, 3), (2, None, 2), (1, 4, 4)])
@pytest.mark.parametrize("post_update", [True, False])
def test_all_critic_passes_then_the_post_update_rescore_then_the_policy_passes(
    ppo_epochs: int, critic_ppo_epochs: int | None, critic_passes: int, post_update: bool
) -> None:
    settings = settings_from_config(
        GAE,
        {
            "ppo_epochs": ppo_epochs,
            "critic_ppo_epochs": critic_ppo_epochs,
            "log_post_update_critic_metrics": post_update,
        },
    )
    batch = _order_batch()
    output, log = _run(settings, batch, _row_constant(ORDER_VALUES, batch.seq_len))

    # ppo_step's docstring: values (before any update), old logprobs, critic passes, policy passes; the
    # optional forward-only re-score follows the last critic pass. One PPO epoch: the policy pass scores its own.
    expected = ["value.values"] + ["policy.logprobs"] * (ppo_epochs > 1) + ["value.train"] * critic_passes
    expected += ["value.evaluate"] * post_update + ["policy.train"] * ppo_epochs
    assert log.labels == expected

    metrics = output.metrics
    assert metrics["critic/explained_var"] == pytest.approx(0.6, abs=1e-6)
    assert metrics["critic/ev_res"] == pytest.approx(0.9, abs=1e-6)
    # The loss-derived EV of the training passes is kept apart from the pre-update one.
    pass_evs = [pass_metrics(index)["critic/explained_var"] for index in range(critic_passes)]
    assert min(pass_evs) - 1e-9 <= metrics["critic/explained_var_last_pass"] <= max(pass_evs) + 1e-9
    if post_update:
        assert metrics["critic/explained_var_post_update"] == POST_UPDATE_METRICS["critic/explained_var"]
        assert metrics["critic/loss_post_update"] == POST_UPDATE_METRICS["critic/loss"]
        rescore = log.of("value.evaluate")[0]
        last_pass = log.of("value.train")[-1]
        assert rescore.offsets is not None and last_pass.offsets is not None
        assert torch.equal(rescore.offsets[1], last_pass.offsets[1])
        assert rescore.batch.returns is not None and last_pass.batch.returns is not None
        assert torch.equal(rescore.batch.returns, last_pass.batch.returns)
    else:
        assert not any(key.endswith("_post_update") for key in metrics)

    # Every pass sees the targets and the advantages computed once, before any update.
    first_returns, first_advantages = _only(log, "value.train").returns, _only(log, "policy.train").advantages
    assert first_returns is not None and first_advantages is not None
    for call in log.of("value.train"):
        assert call.batch.returns is not None and torch.equal(call.batch.returns, first_returns)
    for call in log.of("policy.train"):
        assert call.batch.advantages is not None and torch.equal(call.batch.advantages, first_advantages)


@pytest.mark.parametrize(
    ("ppo", "loss_fn", "fused"),
    [
        ({}, {}, True),
        ({"ppo_epochs": 2}, {}, False),  # the second pass starts from updated weights
        ({"seq_logprob_error_threshold": 2.0}, {}, False),  # masking needs them before the pass
        (
            {"skip_reference_policy_logprobs_calculation": False},
            {"use_kl_in_reward": True, "reference_policy_kl_penalty": 0.1},
            False,  # the KL in the reward feeds the advantages
        ),
    ],
)
def test_one_epoch_over_one_global_batch_takes_old_logprobs_from_the_policy_pass(
    ppo: dict[str, Any], loss_fn: dict[str, Any], fused: bool
) -> None:
    settings = settings_from_config(GAE, {"ppo_epochs": 1, **ppo}, loss_fn=loss_fn)
    assert settings.old_logprobs_from_training is fused
    batch = _order_batch()
    output, log = _run(settings, batch, _row_constant(ORDER_VALUES, batch.seq_len))
    assert ("policy.logprobs" in log.labels) is not fused
    assert ("timing/logprobs" in output.metrics) is not fused
    # Either way the step's batch carries the old logprobs (the fakes answer the generation logprobs) and the
    # mismatch metrics are computed from them.
    assert output.batch.old_logprobs is not None
    assert torch.equal(output.batch.old_logprobs, batch.generation_logprobs)
    assert output.metrics["mismatch/token_mult_prob_error"] == pytest.approx(1.0)
    if fused:
        assert all(call.batch.old_logprobs is None for call in log.of("policy.train"))


def test_a_batch_over_one_global_batch_scores_old_logprobs_first() -> None:
    settings = dataclasses.replace(settings_from_config(GAE, {"ppo_epochs": 1}), policy_global_batch_size=2)
    batch = _order_batch()
    assert len(batch) > 2
    _, log = _run(settings, batch, _row_constant(ORDER_VALUES, batch.seq_len))
    assert "policy.logprobs" in log.labels


def test_explained_var_last_pass_is_the_last_critic_pass() -> None:
    settings = settings_from_config(GAE, {"ppo_epochs": 1, "critic_ppo_epochs": 3})
    batch = _order_batch()
    output, _ = _run(settings, batch, _row_constant(ORDER_VALUES, batch.seq_len))
    assert output.metrics["critic/explained_var_last_pass"] == pytest.approx(pass_metrics(2)["critic/explained_var"])


@pytest.mark.parametrize(("step", "policy_trains"), [(0, False), (1, False), (2, True), (5, True)])
def test_critic_warm_up_trains_the_critic_but_never_the_policy(step: int, policy_trains: bool) -> None:
    settings = settings_from_config(GAE, {"ppo_epochs": 1, "critic_ppo_epochs": 2, "policy_training_start_step": 2})
    batch = _order_batch()
    output, log = _run(settings, batch, _row_constant(ORDER_VALUES, batch.seq_len), step=step)

    # A step that trains the policy (one epoch) takes the old logprobs from that pass; a warm-up step scores them.
    expected = ["value.values"] + ["policy.logprobs"] * (not policy_trains) + ["value.train", "value.train"]
    assert log.labels == expected + ["policy.train"] * policy_trains
    assert output.policy_trained is policy_trains
    assert output.metrics["train/policy_trained"] == float(policy_trains)
    assert ("policy/loss" in output.metrics) is policy_trains
    # The critic's pre-update diagnostics do not depend on the warm-up.
    assert output.metrics["critic/explained_var"] == pytest.approx(0.6, abs=1e-6)


# --- 4. homogeneous-group weighting of the critic ----------------------------------------------------------------


# Groups of two: (1, 1) all pass, (0, 1) mixed, (0, 0) all fail. Residual on, gamma = lambda = 1: Y = R - B.
# Mixed group: B = (1, 0), Y = (-1, 1); with C = (-0.5, 0.5) the errors are (-0.5, 0.5), Var = 0.25, Var(Y) = 1,
# so critic/ev_res_mixed_group = 1 - 0.25 / 1 = 0.75 over its 4 response tokens.
@pytest.mark.parametrize("weight", [0.25, 0.0, 1.0])
def test_homogeneous_groups_get_the_configured_critic_weight_and_mixed_groups_one(weight: float) -> None:
    rewards, groups = [1.0, 1.0, 0.0, 1.0, 0.0, 0.0], [0, 0, 1, 1, 2, 2]
    batch = collate([single_turn(2, 2, rewards[row], groups[row], row % 2) for row in range(6)])
    settings = settings_from_config(
        {**GAE, "residual_baseline": True}, value_loss_fn={"homogeneous_group_weight": weight}
    )
    values = _row_constant([0.0, 0.0, -0.5, 0.5, 0.0, 0.0], batch.seq_len)
    output, log = _run(settings, batch, values)

    expected = [weight, weight, 1.0, 1.0, weight, weight]
    for call in log.of("value.train"):
        assert call.batch.critic_sample_mask is not None
        _close(call.batch.critic_sample_mask, expected)
    # The weighting is the critic's alone: the policy's sample mask is untouched.
    _close(_only(log, "policy.train").sample_mask, torch.ones(6))
    assert output.metrics["critic/ev_res_mixed_group"] == pytest.approx(0.75, abs=1e-6)
    assert output.metrics["critic/n_mixed_group_tokens"] == 4.0
    assert output.metrics["residual/frac_groups_mixed"] == pytest.approx(1 / 3)


# --- 5. mask_sample ------------------------------------------------------------------------------------------------


def test_masked_sample_trains_no_policy_but_sets_its_siblings_baseline_and_keeps_its_targets() -> None:
    # Group 0 = (1 masked, 0, 0), group 1 = (1, 0). B counts the masked rollout for its siblings:
    # B = (0, (1+0)/2, (1+0)/2, 0, 1) = (0, 0.5, 0.5, 0, 1); without it rows 1 and 2 would get B = 0.
    # C = 0, gamma = lambda = 1: Y = R - B = (1, -0.5, -0.5, 1, -1) and A = R - (C + B) = Y.
    rewards, groups = [1.0, 0.0, 0.0, 1.0, 0.0], [0, 0, 0, 1, 1]
    batch = collate([single_turn(2, 2, rewards[row], groups[row], row, mask_sample=row == 0) for row in range(5)])
    settings = settings_from_config({**GAE, "residual_baseline": True})
    output, log = _run(settings, batch, torch.zeros(batch.input_ids.shape))

    policy_batch = _only(log, "policy.train")
    _close(policy_batch.sample_mask, [0.0, 1.0, 1.0, 1.0, 1.0])
    response = batch.token_mask
    assert policy_batch.advantages is not None
    _close(policy_batch.advantages, torch.tensor([0.0, -0.5, -0.5, 1.0, -1.0])[:, None] * response)

    call = log.of("value.train")[0]
    assert call.offsets is not None
    _close(call.offsets[0], torch.tensor([0.0, 0.5, 0.5, 0.0, 1.0]))
    critic = call.batch
    assert critic.returns is not None
    _close(critic.returns, torch.tensor([1.0, -0.5, -0.5, 1.0, -1.0])[:, None] * response)
    # Like the seed's value batch (sample_mask copied from the policy's), the masked row gets no critic weight.
    assert critic.critic_sample_mask is not None
    _close(critic.critic_sample_mask, [0.0, 1.0, 1.0, 1.0, 1.0])
    assert output.metrics["residual/frac_traj_sample_masked"] == pytest.approx(0.2)
    # The pre-update EV pools over token_mask x sample_mask, so the masked row is left out. Rows 1-4: G - V = Y =
    # (-0.5, -0.5, 1, -1), mean -0.25, Var = (0.0625 + 0.0625 + 1.5625 + 0.5625) / 4 = 0.5625; absolute targets
    # Y + B = R = (0, 0, 1, 0), Var = 0.1875 -> 1 - 0.5625 / 0.1875 = -2 (all five rows: 1 - 0.7 / 0.24).
    assert output.metrics["critic/explained_var"] == pytest.approx(-2.0, abs=1e-5)


def test_masked_sample_stays_out_of_the_advantage_whitening() -> None:
    # Whitening statistics over token_mask x sample_mask: the masked row (with an outlying reward) must not move
    # them, so the other rows' whitened advantages equal those of the same step run without that row.
    rewards, groups, lengths = [5.0, 0.0, 1.0, 1.0, 0.0], [0, 0, 0, 1, 1], [2, 3, 4, 1, 4]
    rows = [single_turn(2, lengths[row], rewards[row], groups[row], row, mask_sample=row == 0) for row in range(5)]
    values = 0.2 * torch.randn(5, 6, generator=torch.Generator().manual_seed(7))
    settings = settings_from_config({**GAE, "gae_lambda": 0.9, "normalize_advantages": True})

    _, with_masked_log = _run(settings, collate(rows), values)
    _, without_log = _run(settings, collate(rows[1:]), values[1:])

    with_masked = _only(with_masked_log, "policy.train").advantages
    without = _only(without_log, "policy.train").advantages
    assert with_masked is not None and without is not None
    _close(with_masked[0], torch.zeros(6))
    _close(with_masked[1:], without, atol=1e-5)
    assert without.abs().sum() > 1.0


def test_token_counters_add_up_over_passes_while_other_metrics_average() -> None:
    # Two policy passes of 30 computed / 24 real training tokens; the worker books the step's scoring forwards
    # (old logprobs: 12 / 10) on its first train call only. Losses 1 and 3 average to 2.
    passes = [
        {"policy/loss": 1.0, "policy/tokens_computed": 30.0, "policy/tokens_real": 24.0},
        {"policy/loss": 3.0, "policy/tokens_computed": 30.0, "policy/tokens_real": 24.0},
    ]
    passes[0] |= {"policy/scored_tokens_computed": 12.0, "policy/scored_tokens_real": 10.0}
    assert average_metrics(passes) == {
        "policy/loss": 2.0,
        "policy/tokens_computed": 60.0,
        "policy/tokens_real": 48.0,
        "policy/scored_tokens_computed": 12.0,
        "policy/scored_tokens_real": 10.0,
    }
