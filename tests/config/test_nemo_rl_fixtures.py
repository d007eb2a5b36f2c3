"""Every mirrored NeMo-RL config (tests/data/nemo_rl/examples, listed in its README.txt) through the CLI as a user
runs it: `asyncppo config port` exits 0 and `asyncppo config show` accepts the written config, or it exits 2
refusing only features asyncppo lacks, one `error:` line per refused key, each naming the feature."""

import contextlib
import io
from pathlib import Path

import pytest

from asyncppo.cli.main import main

DATA = Path(__file__).parents[1] / "data" / "nemo_rl"
MIRRORS = sorted((DATA / "examples").rglob("*.yaml"))
FEATURE = "asyncppo has no "
"""Every refusal of a feature asyncppo lacks says so with these words, then names the feature."""

SWE_GRPO = {
    "grpo.advantage_clip_low",
    "grpo.advantage_clip_high",
    "grpo.invalid_tool_call_advantage",
    "grpo.malformed_thinking_advantage",
    "grpo.async_grpo.max_generation_failures",
    "policy.tokenizer.chat_template_kwargs.enable_thinking",
}
EXPECTED_REFUSALS: dict[str, set[str]] = {
    "grpo_math_1B_megatron_single_controller.yaml": {"async_rl.sampler.name"},
    "grpo_math_70B_megatron_fp8.yaml": {"policy.megatron_cfg.fp8_cfg.enabled", "policy.generation.vllm_cfg.precision"},
    "grpo_math_8B_megatron_fp8.yaml": {"policy.megatron_cfg.fp8_cfg.enabled", "policy.generation.vllm_cfg.precision"},
    "grpo_multiple_datasets.yaml": {"data.train", "data.validation"},
    "grpo_rm_1B.yaml": {"data.default.env_name", "env.reward_model.processor"},
    "grpo_sliding_puzzle.yaml": {"env.sliding_puzzle_game.cfg.game_config.size"},
    "grpo_qwen3_30ba3b_thinking_swe1.yaml": SWE_GRPO,
    "grpo_qwen3_30ba3b_thinking_swe2.yaml": SWE_GRPO,
    # The recipe turns checkpointing off (its metric is then not read) and MoE router replay on.
    "grpo-qwen3-30ba3b-thinking-swe1-16n8g-megatron-cp2-r3-async-gym.yaml": SWE_GRPO | {"policy.router_replay.enabled"},
    "gdpo_multireward.yaml": {"grpo.adv_estimator.name"},
    "gdpo_example_tool_call_multireward.yaml": {"grpo.adv_estimator.name"},
}
"""The keys each mirror refuses (fixtures not named here port whole)."""


def _asyncppo(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(list(args))
    return status, out.getvalue(), err.getvalue()


def test_the_readme_lists_every_mirror() -> None:
    listed = [line.strip() for line in (DATA / "README.txt").read_text().splitlines() if line.startswith("  examples/")]
    assert listed == [str(path.relative_to(DATA)) for path in MIRRORS]
    assert set(EXPECTED_REFUSALS) <= {path.name for path in MIRRORS}


@pytest.mark.parametrize("path", MIRRORS, ids=lambda path: path.name)
def test_a_mirror_ports_or_refuses_only_features_asyncppo_lacks(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HOME", "/data/hf")  # a recipe reads its data paths through ${oc.env:HF_HOME}
    output = tmp_path / "ported.yaml"
    status, stdout, stderr = _asyncppo("config", "port", str(path), "-o", str(output))
    errors = [line.removeprefix("error: ") for line in stderr.splitlines() if line.startswith("error: ")]
    expected = EXPECTED_REFUSALS.get(path.name, set())
    if not expected:
        assert (status, errors) == (0, []), stderr
        assert f"wrote {output}" in stdout
        shown, _, shown_err = _asyncppo("config", "show", str(output))
        assert shown == 0, shown_err
        return
    assert status == 2 and not output.exists()
    assert {line.split(": refused: ")[0] for line in errors} == expected
    for line in errors:
        assert ": refused: " in line and FEATURE in line, line
        feature = line.split(FEATURE, 1)[1]
        assert len(feature.split()) >= 2, line  # names the feature, not a bare word
