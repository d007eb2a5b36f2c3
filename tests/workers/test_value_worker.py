"""ValueWorker on the tiny model: values, fitting the returns, EV from summed statistics, resume, warm start."""

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification
from worker_fakes import assert_resumes_bit_exactly, make_batch, weights_of

from asyncppo.algorithms.critic_metrics import pooled_explained_variance
from asyncppo.config.losses import ValueLossConfig
from asyncppo.config.models import SchedulerConfig
from asyncppo.models.value import value_head, values
from asyncppo.types import TrainBatch
from asyncppo.workers.value_worker import ValueWorker

LENGTHS = [8, 12, 10, 6, 12, 7]
MakeValue = Callable[..., ValueWorker]


def randomize_head(worker: ValueWorker) -> None:
    """A non-zero head, as after training (a zero head predicts 0 everywhere and hides mistakes)."""
    with torch.no_grad():
        head = value_head(worker.model)
        head.weight.copy_(torch.randn(head.weight.shape, generator=torch.Generator().manual_seed(3)))


def critic_batch(worker: ValueWorker) -> TrainBatch:
    """The batch as the driver hands it over: rollout-time values filled in."""
    batch = make_batch(LENGTHS)
    return batch.with_fields(values=worker.values(batch))


def test_values_equal_the_models_right_shifted_values(make_value: MakeValue) -> None:
    worker = make_value(logprob_batch_size=4)
    randomize_head(worker)
    batch = make_batch(LENGTHS)
    with torch.no_grad():
        expected = values(worker.model, batch.input_ids, batch.attention_mask)
    actual = worker.values(batch)
    assert actual.dtype == torch.float32 and actual.device.type == "cpu"
    assert torch.all(actual[:, 0] == 0) and torch.any(actual != 0)
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-5)


def test_training_moves_values_toward_the_returns(make_value: MakeValue) -> None:
    worker = make_value(loss_settings=ValueLossConfig(scale=1.0, cliprange=0.5))
    batch = critic_batch(worker)
    first = worker.evaluate(batch)["critic/loss"]
    for _ in range(4):
        metrics = worker.train(batch)
    assert metrics["critic/num_optimizer_steps"] == 1
    assert worker.evaluate(batch)["critic/loss"] < 0.5 * first


def test_explained_variance_from_summed_statistics_matches_pooled_ev(make_value: MakeValue) -> None:
    # A split into micro-batches and a token budget must still give the whole-batch EV in both spaces.
    worker = make_value(max_tokens_per_microbatch=24)
    randomize_head(worker)
    batch = critic_batch(worker)
    assert batch.returns is not None and batch.values is not None
    offsets = (torch.linspace(0.0, 1.0, len(LENGTHS)), torch.tensor([0.5, -0.5, 0.2, 0.0, 1.0, -1.0]))
    before = weights_of(worker.model)
    metrics = worker.evaluate(batch, offsets=offsets)
    mask = batch.token_mask * batch.sample_mask[:, None]
    ev_abs, ev_res = pooled_explained_variance(batch.values, batch.returns, mask, *offsets)
    # Relative too: with a random head the EVs reach -400, where fp32 sums in another order differ by ~2e-5.
    assert metrics["critic/explained_var"] == pytest.approx(ev_abs, rel=1e-6, abs=1e-5)
    assert metrics["critic/explained_var_res"] == pytest.approx(ev_res, rel=1e-6, abs=1e-5)
    assert ev_abs != pytest.approx(ev_res)  # the offsets differ per sample, so the spaces differ
    assert "critic/num_optimizer_steps" not in metrics and not worker.optimizer.state
    assert all(torch.equal(tensor, before[name]) for name, tensor in weights_of(worker.model).items())


def test_critic_masks_override_the_policy_masks(make_value: MakeValue) -> None:
    worker = make_value()
    batch = critic_batch(worker)
    only_row_one = torch.zeros(len(LENGTHS))
    only_row_one[1] = 1.0
    metrics = worker.evaluate(batch.with_fields(critic_sample_mask=only_row_one))
    assert metrics["critic/num_valid_samples"] == 1.0


def test_save_and_load_resume_bit_exactly(make_value: MakeValue, tmp_path: Path) -> None:
    schedule = SchedulerConfig(name="cosine", warmup_steps=1, total_steps=5, min_lr_ratio=0.1)
    worker = make_value(scheduler=schedule)
    batch = critic_batch(worker)
    worker.train(batch)
    saved = assert_resumes_bit_exactly(worker, make_value(scheduler=schedule), batch, tmp_path / "value")

    torch.load(tmp_path / "value" / "optimizer.pt", weights_only=True)
    torch.load(tmp_path / "value" / "scheduler.pt", weights_only=True)
    reloaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "value")
    assert all(torch.equal(tensor, saved[name]) for name, tensor in reloaded.state_dict().items())


def test_warm_start_keeps_the_weights_and_resets_the_optimizer(make_value: MakeValue, tmp_path: Path) -> None:
    schedule = SchedulerConfig(name="linear", warmup_steps=3, total_steps=10, min_lr_ratio=0.0)
    pretrained = make_value(scheduler=schedule)
    pretrained.train(critic_batch(pretrained))
    pretrained.save(tmp_path / "critic")

    worker = make_value(scheduler=schedule)
    worker.train(critic_batch(worker))
    assert worker.optimizer.state and worker.scheduler.last_epoch == 1
    worker.warm_start(tmp_path / "critic")
    assert not worker.optimizer.state
    assert worker.scheduler.last_epoch == 0 and worker.optimizer.param_groups[0]["lr"] == 0.0  # warmup from 0
    trained = weights_of(pretrained.model)
    assert all(torch.equal(tensor, trained[name]) for name, tensor in weights_of(worker.model).items())


def test_train_needs_returns_and_old_values_when_clipping(make_value: MakeValue) -> None:
    worker = make_value(loss_settings=ValueLossConfig(scale=1.0, cliprange=0.2))
    batch = make_batch(LENGTHS)
    with pytest.raises(ValueError, match="returns"):
        worker.train(batch.with_fields(returns=None))
    with pytest.raises(ValueError, match=r"batch\.values"):
        worker.train(batch)
    with pytest.raises(ValueError, match="offsets"):
        worker.train(batch.with_fields(values=worker.values(batch)), offsets=(torch.zeros(2), torch.zeros(2)))


def test_the_critic_learns_a_return_that_depends_on_the_state(make_value: MakeValue) -> None:
    """A token early in the sequence decides the return; the critic must tell the two states apart (EV near 1),
    not only learn the mean (EV 0). Guards the whole path: shifted reads, head and backbone gradients, masks."""
    worker = make_value()
    batch = make_batch([20] * 32, seed=1)
    marker = torch.tensor([50 if row % 2 else 60 for row in range(32)])
    input_ids = batch.input_ids.clone()
    input_ids[:, 2] = marker
    returns = (marker == 50).float()[:, None] * batch.token_mask
    batch = batch.with_fields(
        input_ids=input_ids, returns=returns, critic_mask=batch.token_mask, critic_sample_mask=torch.ones(32)
    )
    for _ in range(40):
        batch = batch.with_fields(values=worker.values(batch))
        worker.train(batch)
    values = worker.values(batch)
    ev_abs, _ = pooled_explained_variance(values, returns, batch.token_mask)
    assert ev_abs > 0.9, ev_abs
