"""The shared optimizer loop on a one-parameter fake model: global normalisation, clipping, skipping, NaN guard."""

import pytest
import torch
from worker_fakes import make_batch

from asyncppo.algorithms.microbatch import LossNormalizers, loss_normalizers
from asyncppo.types import TrainBatch
from asyncppo.workers.training import (
    BatchPlan,
    MicroBatch,
    NonFiniteTrainingError,
    average_over_global_batches,
    evaluate_pass,
    train_pass,
)


class FakeModel:
    """One scalar w; per-token loss (w - advantage)^2 over valid tokens, divided by the GLOBAL count.

    loss = sum_{i, t >= 1} m s (w - A)^2 / N, so dloss/dw = 2 (w - mean(A)) over the global batch.
    """

    def __init__(self) -> None:
        self.w = torch.nn.Parameter(torch.zeros(()))

    def loss(self, micro: MicroBatch, normalizers: LossNormalizers) -> tuple[torch.Tensor, dict[str, float]]:
        batch = micro.batch
        assert batch.advantages is not None
        mask = batch.token_mask[:, 1:] * batch.sample_mask[:, None]
        advantages = torch.where(mask > 0, batch.advantages[:, 1:], 0.0)
        loss = ((self.w - advantages).square() * mask).sum() / normalizers.valid_tokens
        return loss, {
            "loss": float(loss.detach()),
            "rows_min": float(micro.rows.min()),
            "rows_max": float(micro.rows.max()),
        }


def normalize(batch: TrainBatch) -> LossNormalizers:
    return loss_normalizers(batch.token_mask, batch.sample_mask)


def run(batch: TrainBatch, plan: BatchPlan, optimizer_name: str = "sgd", max_grad_norm: float | None = None):
    model = FakeModel()
    if optimizer_name == "sgd":
        optimizer: torch.optim.Optimizer = torch.optim.SGD([model.w], lr=1.0)
    else:
        optimizer = torch.optim.AdamW([model.w], lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    metrics = train_pass(
        batch,
        model.loss,
        normalize,
        plan=plan,
        optimizer=optimizer,
        scheduler=scheduler,
        max_grad_norm=max_grad_norm,
        device=torch.device("cpu"),
    )
    return model, optimizer, metrics


@pytest.mark.parametrize("micro_batch_size", [1, 2])
def test_loss_and_gradient_are_global_whatever_the_micro_batch_split(micro_batch_size: int) -> None:
    # Rows of length 5 and 7, prompt 3: row 0 has 2 valid tokens with A = -1, row 1 has 4 with A = +1.
    # At w = 0: loss = mean(A^2) = 1; grad = -2 mean(A) = -2 (4 - 2) / 6 = -2/3; SGD(lr 1): w = 2/3.
    batch = make_batch([5, 7])
    model, _, metrics = run(batch, BatchPlan(None, micro_batch_size, None))
    assert metrics["loss"] == pytest.approx(1.0)
    assert metrics["grad_norm"] == pytest.approx(2 / 3)
    assert float(model.w.detach()) == pytest.approx(2 / 3)
    assert metrics["num_optimizer_steps"] == 1 and metrics["lr"] == 1.0


def test_clipping_scales_the_step_but_reports_the_norm_before_clipping() -> None:
    model, _, metrics = run(make_batch([5, 7]), BatchPlan(None, 2, None), max_grad_norm=0.1)
    assert metrics["grad_norm"] == pytest.approx(2 / 3)
    assert float(model.w.detach()) == pytest.approx(0.1, rel=1e-5)  # gradient -2/3 clipped to norm 0.1


def test_each_global_batch_takes_one_step_and_metrics_average_over_them() -> None:
    # Global batches {0, 1}, {2, 3}, {4}; per batch min/max of the rows seen reduce by min/max.
    model, optimizer, metrics = run(make_batch([5, 7, 6, 6, 8]), BatchPlan(2, 1, None), optimizer_name="adam")
    assert metrics["num_optimizer_steps"] == 3 and metrics["num_empty_global_batches"] == 0
    assert optimizer.state[model.w]["step"] == 3
    assert metrics["rows_min"] == 0 and metrics["rows_max"] == 4


def test_a_global_batch_with_no_valid_token_is_skipped_without_a_step() -> None:
    batch = make_batch([5, 7, 6, 6, 8])
    batch = batch.with_fields(sample_mask=torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0]))
    model, optimizer, metrics = run(batch, BatchPlan(2, 2, None), optimizer_name="adam")
    assert metrics["num_optimizer_steps"] == 2 and metrics["num_empty_global_batches"] == 1
    assert optimizer.state[model.w]["step"] == 2


def test_a_nan_loss_raises_naming_its_global_batch_and_takes_no_step() -> None:
    batch = make_batch([5, 7, 6, 6, 8])
    assert batch.advantages is not None
    advantages = batch.advantages.clone()
    advantages[4, 5] = float("nan")  # row 4 = global batch 2
    with pytest.raises(NonFiniteTrainingError, match=r"global batch 2 \(rows 4\.\.4\)"):
        run(batch.with_fields(advantages=advantages), BatchPlan(2, 2, None))


def test_evaluation_reports_the_whole_batch_loss_without_stepping() -> None:
    model = FakeModel()
    metrics = evaluate_pass(
        make_batch([5, 7]), model.loss, normalize, plan=BatchPlan(1, 1, None), device=torch.device("cpu")
    )
    assert metrics["loss"] == pytest.approx(1.0)  # one global batch even though global_batch_size is 1
    assert float(model.w.detach()) == 0.0 and model.w.grad is None


def test_pass_metrics_take_min_of_mins_max_of_maxes_and_the_mean_of_the_rest() -> None:
    per_batch = [{"loss": 1.0, "ratio_min": 3.0, "ratio_max": 1.0}, {"loss": 3.0, "ratio_min": 2.0, "ratio_max": 5.0}]
    assert average_over_global_batches(per_batch) == {"loss": 2.0, "ratio_min": 2.0, "ratio_max": 5.0}
