"""The `perf/*` metrics (trainer/perf.py) on synthetic batches and step metrics: known FLOPs give known MFU, the
peak's sources (the table, cluster.peak_tflops, none on CPU), the padding ratio from the workers' token counters,
and phases that did not run leave their keys out.

The models have the shape of tests/model_shapes.py's SMALL decoder (hidden 4, intermediate 8, 2 layers, 2
heads of width 2, 1 KV head, vocab 10): N = 328 for the policy, 292 for the critic, A = 4.
"""

import logging
from pathlib import Path

import pytest
from ppo_fakes import GAE, collate, single_turn
from transformers import GPT2Config, LlamaConfig

from asyncppo.config import validate_tree
from asyncppo.models.flops import FlopCounter
from asyncppo.trainer.perf import PerfMeter, known_peak_tflops, padding_ratio, peak_flops_per_device, perf_meter
from asyncppo.trainer.placement import Layout
from asyncppo.trainer.setup import ModelPaths
from asyncppo.types import TrainBatch
from model_shapes import SMALL

PEAK = 1e4  # FLOP/s per device
# Sequences of 3 and 2 real tokens (prompt + response), 5 in all.
# policy forward: L=3 2 x 328 x 3 + 2 x 4 x 4 x 6 = 1968 + 192 = 2160; L=2 2 x 328 x 2 + 2 x 4 x 4 x 3 = 1312 + 96
#   = 1408; together 3568.
# critic forward: L=3 2 x 292 x 3 + 192 = 1944; L=2 2 x 292 x 2 + 96 = 1264; together 3208.
POLICY_FORWARD, CRITIC_FORWARD = 3568, 3208
MFU_KEYS = {
    "perf/values_mfu",
    "perf/logprobs_mfu",
    "perf/reference_logprobs_mfu",
    "perf/critic_train_mfu",
    "perf/policy_train_mfu",
    "perf/step_flops_utilization",
}
COUNTERS = {
    "policy/tokens_computed": 60.0,
    "policy/tokens_real": 48.0,
    "policy/scored_tokens_computed": 12.0,
    "policy/scored_tokens_real": 10.0,
    "critic/tokens_computed": 90.0,
    "critic/tokens_real": 72.0,
    "critic/scored_tokens_computed": 8.0,
    "critic/scored_tokens_real": 8.0,
}


def _meter(peak_flops: float | None = PEAK, critic: bool = True, **layout: int) -> PerfMeter:
    """A meter of SMALL models; unless `layout` says otherwise, 2 policy devices, the critic on 1, 4 devices in the
    run (a generator too), 2 policy and 3 critic epochs."""
    counts = {"policy_devices": 2, "critic_devices": 1, "all_devices": 4, "ppo_epochs": 2, "critic_ppo_epochs": 3}
    return PerfMeter(
        policy=FlopCounter.for_model(SMALL, "policy"),
        critic=FlopCounter.for_model(SMALL, "critic") if critic else None,
        peak_flops=peak_flops,
        **(counts | layout),
    )


def _batch() -> TrainBatch:
    return collate([single_turn(2, 1, 1.0, group_id=0), single_turn(1, 1, 0.0, group_id=0)])


def _timings() -> dict[str, float]:
    return {
        "timing/step": 10.0,
        "timing/values": 0.8,
        "timing/logprobs": 0.4,
        "timing/critic_train": 4.0,
        "timing/policy_train": 2.0,
    }


def test_the_batch_holds_sequences_of_three_and_two_tokens():
    assert _batch().attention_mask.sum(dim=1).tolist() == [3, 2]
    assert FlopCounter.for_model(SMALL, "policy").forward([3, 2]) == POLICY_FORWARD
    assert FlopCounter.for_model(SMALL, "critic").forward([3, 2]) == CRITIC_FORWARD


def test_known_flops_give_known_mfu_per_phase_and_for_the_step():
    perf = _meter().step_metrics(_batch(), _timings())
    # values: 3208 / (0.8 s x 1 device x 1e4) = 0.401; logprobs: 3568 / (0.4 x 2 x 1e4) = 0.446.
    assert perf["perf/values_mfu"] == pytest.approx(0.401)
    assert perf["perf/logprobs_mfu"] == pytest.approx(0.446)
    # critic_train: 3 x 3208 x 3 epochs = 28,872 / (4 x 1 x 1e4) = 0.7218.
    assert perf["perf/critic_train_mfu"] == pytest.approx(0.7218)
    # policy_train: 3 x 3568 x 2 epochs = 21,408 / (2 x 2 x 1e4) = 0.5352.
    assert perf["perf/policy_train_mfu"] == pytest.approx(0.5352)
    # The step: generation 3568 + logprobs 3568 + values 3208 + 21,408 + 28,872 = 60,624 / (10 s x 4 x 1e4).
    assert perf["perf/step_flops_utilization"] == pytest.approx(60_624 / 400_000)
    # 5 real tokens x 2 epochs / 10 s.
    assert perf["perf/trained_tokens_per_s"] == pytest.approx(1.0)
    assert "perf/reference_logprobs_mfu" not in perf  # the phase did not run
    assert "perf/padding_ratio" not in perf  # no worker reported its counters


def test_reference_logprobs_count_when_they_ran():
    perf = _meter().step_metrics(_batch(), {**_timings(), "timing/reference_logprobs": 0.8})
    # 3568 / (0.8 x 2 x 1e4) = 0.223; the step adds another policy forward: 64,192 / 400,000.
    assert perf["perf/reference_logprobs_mfu"] == pytest.approx(0.223)
    assert perf["perf/step_flops_utilization"] == pytest.approx((60_624 + 3568) / 400_000)


def test_phases_that_did_not_run_leave_their_keys_out():
    # A critic warm-up step: the policy did not train.
    metrics = {key: value for key, value in _timings().items() if key != "timing/policy_train"}
    perf = _meter().step_metrics(_batch(), metrics)
    assert set(perf) & MFU_KEYS == MFU_KEYS - {"perf/policy_train_mfu", "perf/reference_logprobs_mfu"}
    assert perf["perf/trained_tokens_per_s"] == 0.0  # the policy trained no token
    # Without the policy's 21,408 training FLOPs: 39,216 / 400,000.
    assert perf["perf/step_flops_utilization"] == pytest.approx((60_624 - 21_408) / 400_000)


def test_a_run_without_a_critic_has_no_critic_keys():
    meter = _meter(critic=False, policy_devices=1, critic_devices=0, all_devices=1, ppo_epochs=1, critic_ppo_epochs=1)
    perf = meter.step_metrics(_batch(), {"timing/step": 2.0, "timing/logprobs": 0.5, "timing/policy_train": 1.0})
    assert set(perf) == {
        "perf/logprobs_mfu",
        "perf/policy_train_mfu",
        "perf/step_flops_utilization",
        "perf/trained_tokens_per_s",
    }
    # generation + logprobs + 3 x training = 5 x 3568 = 17,840 / (2 s x 1 device x 1e4).
    assert perf["perf/step_flops_utilization"] == pytest.approx(0.892)


def test_without_a_peak_only_padding_and_tokens_per_second_are_logged():
    perf = _meter(peak_flops=None).step_metrics(_batch(), {**_timings(), **COUNTERS})
    assert set(perf) == {"perf/padding_ratio", "perf/trained_tokens_per_s"}


def test_padding_ratio_sums_every_reported_counter_pair():
    # (60 + 12 + 90 + 8) computed / (48 + 10 + 72 + 8) real = 170 / 138.
    assert padding_ratio(COUNTERS) == pytest.approx(170 / 138)
    perf = _meter().step_metrics(_batch(), {**_timings(), **COUNTERS})
    assert perf["perf/padding_ratio"] == pytest.approx(170 / 138)
    # Only the policy reported (e.g. a run without a critic): (60 + 12) / (48 + 10).
    policy_only = {key: value for key, value in COUNTERS.items() if key.startswith("policy/")}
    assert padding_ratio(policy_only) == pytest.approx(72 / 58)
    # A counter without its partner counts for nothing; nothing reported gives no ratio.
    assert padding_ratio({"policy/tokens_computed": 60.0, "policy/tokens_real": 60.0, "critic/tokens_real": 5.0}) == 1.0
    assert padding_ratio({"policy/loss": 0.1}) is None
    assert padding_ratio({"policy/tokens_computed": 0.0, "policy/tokens_real": 0.0}) is None


@pytest.mark.parametrize(
    ("device_name", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA GH200 480GB", 989.0),
        ("NVIDIA H800", 989.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA A100-PCIE-40GB", 312.0),
        ("NVIDIA A800-SXM4-80GB", 312.0),
        ("NVIDIA B200", 2250.0),
        ("NVIDIA L40S", 362.0),
        ("NVIDIA L4", 121.0),
        ("NVIDIA GeForce RTX 4090", None),
        ("Tesla T4", None),
    ],
)
def test_known_devices_are_matched_by_name(device_name: str, tflops: float | None):
    assert known_peak_tflops(device_name) == tflops


def test_the_peak_comes_from_the_override_else_the_table_for_a_16_bit_gpu_run():
    assert peak_flops_per_device(None, "NVIDIA H100 80GB HBM3", sixteen_bit=True) == 989e12
    assert peak_flops_per_device(None, None, sixteen_bit=True) is None  # CPU
    assert peak_flops_per_device(None, "NVIDIA GeForce RTX 4090", sixteen_bit=True) is None  # unknown GPU
    assert peak_flops_per_device(None, "NVIDIA H100 80GB HBM3", sixteen_bit=False) is None  # float32
    # cluster.peak_tflops wins over the table, float32 and the CPU alike.
    assert peak_flops_per_device(500.0, "NVIDIA H100 80GB HBM3", sixteen_bit=True) == 500e12
    assert peak_flops_per_device(500.0, "NVIDIA GeForce RTX 4090", sixteen_bit=False) == 500e12
    assert peak_flops_per_device(0.5, None, sixteen_bit=True) == 0.5e12


def _tree(peak_tflops: float | None) -> dict[str, object]:
    return {
        "model": {"model_name": "tiny:tiny", "train_micro_batch_size": 2, "precision": "bfloat16"},
        "value": {"train_micro_batch_size": 2, "precision": "bfloat16"},
        "data": {"train_path": "unused.jsonl"},
        "ppo": {
            "num_prompts_per_step": 2,
            "num_generations_per_prompt": 2,
            "max_num_steps": 4,
            "ppo_epochs": 2,
            "adv_estimator": GAE,
        },
        "cluster": {"peak_tflops": peak_tflops},
    }


LAYOUT = Layout(policy_ranks=1, critic_ranks=1, critic_own_devices=False, generators=1)


def test_perf_meter_reads_the_model_shapes_and_the_override_on_cpu(tmp_path: Path):
    LlamaConfig(
        hidden_size=4,
        intermediate_size=8,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=10,
    ).save_pretrained(tmp_path)  # config.json only: the meter never loads weights
    paths = ModelPaths(policy=tmp_path, tokenizer=tmp_path, value=tmp_path)
    meter = perf_meter(validate_tree(_tree(peak_tflops=0.5)), paths, LAYOUT, "cpu")
    assert meter == _meter(0.5e12, policy_devices=1, critic_devices=1, all_devices=2, ppo_epochs=2, critic_ppo_epochs=2)
    assert perf_meter(validate_tree(_tree(peak_tflops=None)), paths, LAYOUT, "cpu").peak_flops is None


def test_a_model_shape_the_formula_does_not_count_drops_the_flop_metrics_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    GPT2Config(n_embd=8, n_layer=1, n_head=2, vocab_size=10, bos_token_id=0, eos_token_id=0).save_pretrained(
        tmp_path
    )  # no intermediate_size
    paths = ModelPaths(policy=tmp_path, tokenizer=tmp_path, value=tmp_path)
    with caplog.at_level(logging.WARNING):
        meter = perf_meter(validate_tree(_tree(peak_tflops=100.0)), paths, LAYOUT, "cpu")
    assert meter.policy is None and "intermediate_size" in caplog.text
    perf = meter.step_metrics(_batch(), {**_timings(), **COUNTERS})
    assert set(perf) == {"perf/padding_ratio", "perf/trained_tokens_per_s"}
