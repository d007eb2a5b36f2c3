"""PolicyWorker on the tiny model: scoring, learning, split invariance, step counts, exact resume, weight export."""

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from worker_fakes import assert_resumes_bit_exactly, make_batch, policy_loss_settings, weights_of, with_old_logprobs

from asyncppo.config.models import OptimizerConfig, SchedulerConfig
from asyncppo.models.policy import load_policy, token_logprobs
from asyncppo.workers.policy_worker import PolicyWorker
from asyncppo.workers.scoring import disable_dropout
from asyncppo.workers.training import NonFiniteTrainingError

LENGTHS = [8, 12, 10, 6, 12, 7]
MakePolicy = Callable[..., PolicyWorker]


def test_logprobs_equal_token_logprobs_of_the_loaded_model(make_policy: MakePolicy, tiny_dir: Path) -> None:
    worker = make_policy(temperature=0.7, logprob_batch_size=4, keep_reference=True)
    batch = make_batch(LENGTHS)
    with torch.no_grad():
        expected = token_logprobs(load_policy(tiny_dir), batch.input_ids, batch.attention_mask, temperature=0.7)
    actual = worker.logprobs(batch)
    assert actual.dtype == torch.float32 and actual.device.type == "cpu" and actual.shape == batch.input_ids.shape
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(worker.reference_logprobs(batch), expected, rtol=0, atol=1e-5)


def test_training_raises_logprobs_of_positive_advantage_tokens(make_policy: MakePolicy) -> None:
    worker = make_policy(optimizer=OptimizerConfig(lr=1e-3, weight_decay=0.0, betas=(0.9, 0.999), eps=1e-8))
    batch = with_old_logprobs(worker, make_batch(LENGTHS))
    assert batch.advantages is not None and batch.old_logprobs is not None
    losses = [worker.train(batch)["policy/loss"] for _ in range(3)]  # old logprobs fixed, as within one step
    change = (worker.logprobs(batch) - batch.old_logprobs) * batch.token_mask
    positive, negative = batch.advantages > 0, batch.advantages < 0
    assert losses[2] < losses[1] < losses[0]
    assert change[positive].mean() > 0.05 and change[negative].mean() < -0.05


def test_micro_batch_split_does_not_change_the_update(make_policy: MakePolicy) -> None:
    # eps = 1 makes Adam's first step ~ lr g / (|g| + 1), proportional to the gradient, so a normalisation error
    # (which Adam's usual sign-like first step would hide) shows up in the weights. No clipping for the same reason.
    optimizer = OptimizerConfig(lr=0.1, weight_decay=0.0, betas=(0.9, 0.999), eps=1.0)
    reference = make_policy(optimizer=optimizer, max_grad_norm=None, train_micro_batch_size=len(LENGTHS))
    batch = with_old_logprobs(reference, make_batch(LENGTHS))
    before = weights_of(reference.model)
    reference.train(batch)
    expected = weights_of(reference.model)
    assert max((expected[name] - before[name]).abs().max().item() for name in before) > 1e-3
    # The reference packs its rows; the padded layout and every cut must give the same update.
    splits = [
        {"train_micro_batch_size": 1},
        {"train_micro_batch_size": 4},
        {"max_tokens_per_microbatch": 20},
        {"sequence_packing": False},
        {"sequence_packing": False, "max_tokens_per_microbatch": 20},
    ]
    for split in splits:
        worker = make_policy(optimizer=optimizer, max_grad_norm=None, **split)
        worker.train(batch)
        for name, tensor in weights_of(worker.model).items():
            torch.testing.assert_close(tensor, expected[name], rtol=0, atol=1e-5, msg=f"{split}: {name}")


@pytest.mark.parametrize("packed", [True, False])
def test_train_on_policy_equals_scoring_then_training(make_policy: MakePolicy, packed: bool) -> None:
    # One global batch (train_global_batch_size None), several micro-batches: the forwards of the pass see the same
    # weights, so their logprobs are the old logprobs a scoring pass gives, and the update is the same.
    optimizer = OptimizerConfig(lr=0.1, weight_decay=0.0, betas=(0.9, 0.999), eps=1.0)
    scored_first = make_policy(optimizer=optimizer, max_grad_norm=None, sequence_packing=packed)
    fused = make_policy(optimizer=optimizer, max_grad_norm=None, sequence_packing=packed, train_micro_batch_size=4)
    batch = with_old_logprobs(scored_first, make_batch(LENGTHS))
    expected_metrics = scored_first.train(batch)
    metrics, old_logprobs = fused.train_on_policy(batch.with_fields(old_logprobs=None))
    assert batch.old_logprobs is not None
    torch.testing.assert_close(old_logprobs, batch.old_logprobs, rtol=0, atol=1e-6)
    for name, value in expected_metrics.items():
        if "tokens" not in name:  # the fused worker scored nothing and cut other micro-batches
            assert metrics[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name
    assert metrics["policy/scored_tokens_real"] == 0 and metrics["policy/tokens_real"] == sum(LENGTHS)
    expected = weights_of(scored_first.model)
    for name, tensor in weights_of(fused.model).items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=1e-6, msg=name)


def test_train_on_policy_refuses_a_pass_of_several_optimizer_steps(make_policy: MakePolicy) -> None:
    worker = make_policy(train_global_batch_size=2)
    with pytest.raises(ValueError, match="one global batch"):
        worker.train_on_policy(make_batch(LENGTHS))


def test_one_optimizer_step_per_global_batch_including_the_remainder(make_policy: MakePolicy) -> None:
    # 5 samples in global batches of 2 -> 3 steps. Only row 4 (the remainder batch) has non-zero advantages:
    # the first two steps see zero gradients, which Adam turns into exactly zero updates, so any change in the
    # weights comes from training the remainder.
    worker = make_policy(train_global_batch_size=2)
    batch = with_old_logprobs(worker, make_batch(LENGTHS[:5]))
    assert batch.advantages is not None
    advantages = torch.zeros_like(batch.advantages)
    advantages[4] = batch.advantages[4]
    before = weights_of(worker.model)
    metrics = worker.train(batch.with_fields(advantages=advantages))
    assert metrics["policy/num_optimizer_steps"] == 3
    assert all(int(state["step"]) == 3 for state in worker.optimizer.state.values())
    assert any(not torch.equal(tensor, before[name]) for name, tensor in weights_of(worker.model).items())


def test_save_and_load_resume_bit_exactly(make_policy: MakePolicy, tmp_path: Path) -> None:
    schedule = SchedulerConfig(name="linear", warmup_steps=2, total_steps=10, min_lr_ratio=0.0)
    worker = make_policy(scheduler=schedule)
    batch = with_old_logprobs(worker, make_batch(LENGTHS))
    worker.train(batch)
    worker.train(batch)
    saved = assert_resumes_bit_exactly(worker, make_policy(scheduler=schedule), batch, tmp_path / "policy")

    optimizer_state = torch.load(tmp_path / "policy" / "optimizer.pt", weights_only=True)
    assert "model.embed_tokens.weight" in optimizer_state["state"]  # keyed by name, not position
    assert torch.load(tmp_path / "policy" / "scheduler.pt", weights_only=True)["last_epoch"] == 2
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "policy")
    assert all(torch.equal(tensor, saved[name]) for name, tensor in reloaded.state_dict().items())


def test_load_without_optimizer_starts_a_fresh_optimizer(make_policy: MakePolicy, tmp_path: Path) -> None:
    worker = make_policy()
    worker.train(with_old_logprobs(worker, make_batch(LENGTHS)))
    worker.save(tmp_path / "policy")
    worker.load(tmp_path / "policy", load_optimizer=False)
    assert not worker.optimizer.state and worker.scheduler.last_epoch == 0
    (tmp_path / "policy" / "optimizer.pt").unlink()
    with pytest.raises(ValueError, match=r"lacks \['optimizer.pt'\]"):
        worker.load(tmp_path / "policy")


def test_named_weights_rebuild_the_trained_policy_in_a_fresh_copy(make_policy: MakePolicy, tiny_dir: Path) -> None:
    worker = make_policy()
    worker.train(with_old_logprobs(worker, make_batch(LENGTHS)))
    named = dict(worker.named_weights())
    assert "lm_head.weight" not in named  # tied to the embeddings: sent once
    receiver = load_policy(tiny_dir)
    missing, unexpected = receiver.load_state_dict(named, strict=False)
    assert unexpected == [] and missing == ["lm_head.weight"]
    trained = weights_of(worker.model)
    assert all(torch.equal(tensor, trained[name]) for name, tensor in receiver.state_dict().items())
    assert torch.equal(receiver.lm_head.weight, trained["model.embed_tokens.weight"])


def test_a_nan_loss_raises_naming_the_global_batch(make_policy: MakePolicy) -> None:
    worker = make_policy(train_global_batch_size=2)
    batch = with_old_logprobs(worker, make_batch(LENGTHS[:4]))
    assert batch.advantages is not None
    advantages = batch.advantages.clone()
    advantages[3, 4] = float("nan")
    with pytest.raises(NonFiniteTrainingError, match="global batch 1"):
        worker.train(batch.with_fields(advantages=advantages))
    assert all(int(state["step"]) == 1 for state in worker.optimizer.state.values())  # batch 0 only


def test_train_requires_old_logprobs_and_the_reference_when_the_loss_has_kl(make_policy: MakePolicy) -> None:
    worker = make_policy(loss_settings=policy_loss_settings(reference_policy_kl_penalty=0.1))
    with pytest.raises(ValueError, match="old_logprobs"):
        worker.train(make_batch(LENGTHS))
    with pytest.raises(ValueError, match="reference_logprobs"):
        worker.train(with_old_logprobs(worker, make_batch(LENGTHS)))
    with pytest.raises(ValueError, match="keep_reference"):
        worker.reference_logprobs(make_batch(LENGTHS))


def test_activation_checkpointing_gives_the_same_update(make_policy: MakePolicy) -> None:
    plain, checkpointed = make_policy(), make_policy(activation_checkpointing=True)
    batch = with_old_logprobs(plain, make_batch(LENGTHS))
    plain.train(batch)
    checkpointed.train(batch)
    for name, tensor in weights_of(checkpointed.model).items():
        torch.testing.assert_close(tensor, weights_of(plain.model)[name], rtol=0, atol=1e-6)


def test_dropout_is_disabled_so_train_mode_matches_scoring() -> None:
    config = LlamaConfig(
        vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
    )
    config.attention_dropout = 0.5
    model = LlamaForCausalLM(config)
    disable_dropout(model)
    model.train()
    input_ids = torch.randint(0, 50, (2, 6))
    torch.testing.assert_close(model(input_ids).logits, model.eval()(input_ids).logits, rtol=0, atol=0)
