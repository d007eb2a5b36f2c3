"""AdamW construction and the LR schedule: hand-computed multipliers at given steps, state that loads safely."""

import io
import math

import pytest
import torch

from asyncppo.config.models import OptimizerConfig, SchedulerConfig
from asyncppo.workers.optim import apply_optimizer_settings, build_optimizer, build_scheduler, lr_multiplier

ADAM = OptimizerConfig(lr=0.1, weight_decay=0.0, betas=(0.9, 0.999), eps=1e-8)


def lrs_over_steps(settings: SchedulerConfig, num_steps: int, default_total_steps: int | None = None) -> list[float]:
    """The LR each of the first `num_steps` optimizer steps runs at (scheduler ticked after each step)."""
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = build_optimizer([parameter], ADAM)
    scheduler = build_scheduler(optimizer, settings, default_total_steps)
    used = []
    for _ in range(num_steps):
        used.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return used


def test_constant_schedule_warms_up_linearly_from_zero_then_holds_the_peak() -> None:
    # W = 4: steps 0..3 run at 0/4, 1/4, 2/4, 3/4 of 0.1, then 0.1 forever.
    settings = SchedulerConfig(name="constant", warmup_steps=4, total_steps=None, min_lr_ratio=0.0)
    assert lrs_over_steps(settings, 6) == pytest.approx([0.0, 0.025, 0.05, 0.075, 0.1, 0.1])


def test_linear_decay_reaches_the_floor_at_total_steps_and_stays_there() -> None:
    # W = 2, T = 6, m = 0.2: step s >= 2 has p = (s - 2) / 4 and multiplier 0.2 + 0.8 (1 - p):
    # s=2: 1.0, s=3: 0.8, s=4: 0.6, s=5: 0.4, s=6: 0.2, s=7: 0.2 (clamped).
    settings = SchedulerConfig(name="linear", warmup_steps=2, total_steps=6, min_lr_ratio=0.2)
    expected = [0.0, 0.05, 0.1, 0.08, 0.06, 0.04, 0.02, 0.02]
    assert lrs_over_steps(settings, 8) == pytest.approx(expected)


def test_cosine_decay_takes_the_default_total_steps_when_none_is_set() -> None:
    # No warmup, T = 4 from the worker's default, m = 0: 0.5 (1 + cos(pi s / 4)) for s = 0..4:
    # 1, (1 + sqrt(2)/2)/2 = 0.853553, 0.5, 0.146447, 0.
    settings = SchedulerConfig(name="cosine", warmup_steps=0, total_steps=None, min_lr_ratio=0.0)
    expected = [0.1 * value for value in (1.0, 0.5 + math.sqrt(2) / 4, 0.5, 0.5 - math.sqrt(2) / 4, 0.0)]
    assert lrs_over_steps(settings, 5, default_total_steps=4) == pytest.approx(expected, abs=1e-12)


def test_cosine_with_a_floor_ends_at_min_lr_ratio() -> None:
    settings = SchedulerConfig(name="cosine", warmup_steps=1, total_steps=3, min_lr_ratio=0.1)
    # s=1: p=0 -> 1; s=2: p=0.5 -> 0.1 + 0.9 * 0.5 = 0.55; s=3: p=1 -> 0.1.
    assert [lr_multiplier(step, settings, 3) for step in range(4)] == pytest.approx([0.0, 1.0, 0.55, 0.1])


def test_decaying_schedules_need_total_steps_that_cover_the_warmup() -> None:
    with pytest.raises(ValueError, match="total_steps is required"):
        lrs_over_steps(SchedulerConfig(name="linear", warmup_steps=0, total_steps=None, min_lr_ratio=0.0), 1)
    with pytest.raises(ValueError, match=r"shorter than scheduler\.warmup_steps"):
        lrs_over_steps(SchedulerConfig(name="cosine", warmup_steps=5, total_steps=3, min_lr_ratio=0.0), 1)


def test_optimizer_skips_frozen_parameters_and_states_load_with_weights_only() -> None:
    trained, frozen = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2), requires_grad=False)
    optimizer = build_optimizer([trained, frozen], ADAM)
    assert optimizer.param_groups[0]["params"] == [trained]
    settings = SchedulerConfig(name="linear", warmup_steps=1, total_steps=3, min_lr_ratio=0.0)
    scheduler = build_scheduler(optimizer, settings, None)
    trained.grad = torch.ones(2)
    optimizer.step()
    scheduler.step()
    for state in (optimizer.state_dict(), scheduler.state_dict()):
        buffer = io.BytesIO()
        torch.save(state, buffer)
        buffer.seek(0)
        torch.load(buffer, weights_only=True)
    assert scheduler.state_dict()["last_epoch"] == 1


def test_a_resumed_optimizer_takes_the_configs_lr_and_keeps_its_moments_and_schedule_position() -> None:
    # Warm-up W = 4 and 3 steps taken: the next step runs at 3/4 of the peak, with the saved Adam moments.
    schedule = SchedulerConfig(name="constant", warmup_steps=4, total_steps=None, min_lr_ratio=0.0)
    parameter = torch.nn.Parameter(torch.ones(2))
    optimizer = build_optimizer([parameter], ADAM)
    scheduler = build_scheduler(optimizer, schedule, None)
    for _ in range(3):
        parameter.grad = torch.tensor([1.0, -2.0])
        optimizer.step()
        scheduler.step()
    saved_optimizer, saved_scheduler = optimizer.state_dict(), scheduler.state_dict()

    def resumed(settings: OptimizerConfig) -> torch.optim.Optimizer:
        fresh = build_optimizer([torch.nn.Parameter(parameter.detach().clone())], settings)
        fresh_scheduler = build_scheduler(fresh, schedule, None)
        fresh.load_state_dict(saved_optimizer)
        fresh_scheduler.load_state_dict(saved_scheduler)
        apply_optimizer_settings(fresh, fresh_scheduler, settings)
        return fresh

    unchanged = resumed(ADAM)
    assert unchanged.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"] == 0.1 * (3 / 4)
    changed = resumed(OptimizerConfig(lr=0.2, weight_decay=0.01, betas=(0.8, 0.99), eps=1e-6))
    group = changed.param_groups[0]
    assert (group["lr"], group["initial_lr"], group["weight_decay"], group["betas"], group["eps"]) == (
        0.2 * (3 / 4),
        0.2,
        0.01,
        (0.8, 0.99),
        1e-6,
    )
    moments = next(iter(changed.state.values()))
    assert torch.equal(moments["exp_avg"], next(iter(optimizer.state.values()))["exp_avg"])
