"""`asyncppo bench train`: the workloads' seeded length draws, and a scaled-down longtail run on the tiny model that
prints its tables and trains on exactly the drawn response lengths."""

import dataclasses
import statistics
from pathlib import Path

import pytest
from in_process import run_asyncppo

from asyncppo.cli.bench_train import WORKLOAD_NAMES
from asyncppo.metrics import read_metrics_jsonl
from asyncppo.trainer.train_bench import WORKLOADS, draw_rows

LONGTAIL = WORKLOADS["longtail"]


def test_the_cli_offers_exactly_the_trainers_workloads():
    assert sorted(WORKLOAD_NAMES) == sorted(WORKLOADS)


def test_longtail_draws_are_seeded_lognormal_around_300_capped_at_4096_with_prompts_in_range():
    rows = draw_rows(LONGTAIL, 1000)
    responses = [length for row in rows for length in row.response_tokens]
    assert len(responses) == 8000 and all(len(row.response_tokens) == 8 for row in rows)
    # The sample median of 8000 lognormal draws lies within ~1.4% (1 sd) of exp(mu) = 300.
    assert 285 <= statistics.median(responses) <= 315
    # P(length > 4096) = P(Z > ln(4096 / 300) = 2.61) = 0.45%: ~36 draws hit the cap, none passes it.
    assert max(responses) == 4096 and 10 <= responses.count(4096) <= 80
    assert min(responses) >= 1
    prompts = [row.prompt_tokens for row in rows]
    assert min(prompts) >= 64 and max(prompts) <= 1024
    assert min(prompts) < 80 and max(prompts) > 1000  # uniform over the whole range
    assert draw_rows(LONGTAIL, 10) == rows[:10]  # the same rows, whatever the run's length


def test_trl_responses_are_exactly_512_tokens_after_256_token_prompts():
    rows = draw_rows(WORKLOADS["trl"], 3)
    assert [(row.prompt_tokens, row.response_tokens) for row in rows] == [(256, (512,))] * 3


@pytest.mark.integration
@pytest.mark.slow
def test_a_scaled_down_longtail_run_packed_then_padded_prints_its_tables_and_honours_each_drawn_length(
    ray_cluster: None, shared_cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("ASYNCPPO_CACHE_DIR", str(shared_cache_dir))
    # Responses capped at 96 tokens: about 1 in 8 draws of the lognormal (median 300) falls below the cap, so a
    # step's mean length checks every sample's own budget, not only the cap.
    sizes = [
        "--num-prompts",
        "4",
        "--samples-per-prompt",
        "2",
        "--max-response-tokens",
        "96",
        "--prompt-tokens",
        "16..32",
    ]
    result = run_asyncppo(
        "bench", "train", "--workload", "longtail", "--model", "tiny:tiny", "--steps", "2", "--run-dir", str(tmp_path),
        "--padded", "both", *sizes,
        "cluster.device=cpu", "cluster.gpus_per_node=0", "model.precision=float32", "value.precision=float32",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "| 4 | 2 |" in out  # the workload table: prompts per step, samples per prompt
    headers = [line for line in out.splitlines() if line.startswith("| step |")]
    assert len(headers) == 2  # one phase table per variant
    # One PPO epoch over one global batch: the policy pass scores its own old logprobs (no `logprobs` phase).
    for phase in ("generation", "values", "reference_logprobs", "critic_train", "policy_train", "step"):
        assert f"| {phase} |" in headers[0]
    assert "| logprobs |" not in headers[0]
    assert "mismatch/token_mult_prob_error" in headers[0]
    assert len([line for line in out.splitlines() if line.startswith(("| 1 |", "| 2 |"))]) == 4
    assert "| | packed | padded |" in out
    for label in ("later steps s (median)", "perf/policy_train_mfu (median)", "perf/step_flops_utilization"):
        assert f"| {label}" in out
    assert "padded / packed step time (median of later steps): " in out

    workload = dataclasses.replace(
        LONGTAIL,
        num_prompts=4,
        samples_per_prompt=2,
        max_response_tokens=96,
        min_prompt_tokens=16,
        max_prompt_tokens=32,
    )
    drawn = draw_rows(workload, 8)
    assert any(length < 96 for row in drawn for length in row.response_tokens)  # the test can tell budgets apart
    prompts = [row.prompt_tokens for row in drawn]  # each prompt renders to exactly its drawn length
    assert f"| {min(prompts)} / {statistics.median(prompts):g} / {max(prompts)} |" in out
    for variant in ("packed", "padded"):
        records = [
            record for record in read_metrics_jsonl(tmp_path / variant / "metrics.jsonl") if "timing/step" in record
        ]
        assert len(records) == 2
        for step, record in enumerate(records):
            lengths = [length for row in drawn[4 * step : 4 * step + 4] for length in row.response_tokens]
            assert record["train/response_length_max"] == max(lengths)
            assert record["train/response_length_mean"] == pytest.approx(statistics.fmean(lengths))
