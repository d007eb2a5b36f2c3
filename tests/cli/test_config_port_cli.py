"""`asyncppo config port` as a user runs it, in-process: the table, the written config (which `config show`
accepts), the config on stdout when no -o is given, and exit 2 with `error:` lines for refused keys or a port that
fails validation."""

from pathlib import Path

import yaml
from in_process import run_asyncppo as _asyncppo

REPO = Path(__file__).parents[2]
MATH = "tests/data/nemo_rl/ppo_math_1B.yaml"
GYM = "tests/data/nemo_rl/ppo_async_gym.yaml"


def test_port_writes_a_config_that_config_show_accepts(tmp_path: Path) -> None:
    for source in (MATH, GYM):
        output = tmp_path / f"{Path(source).stem}.yaml"
        result = _asyncppo("config", "port", source, "-o", str(output))
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[0].split() == ["key", "action", "target", "/", "reason"]
        assert "policy.dtensor_cfg.tensor_parallel_size" in result.stdout and f"wrote {output}" in result.stdout
        shown = _asyncppo("config", "show", str(output))
        assert shown.returncode == 0, shown.stderr


def test_port_without_output_prints_the_config_on_stdout_and_the_table_on_stderr() -> None:
    result = _asyncppo("config", "port", MATH)
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["model"]["model_name"] == "Qwen/Qwen2.5-1.5B"
    assert "policy.generation.backend" in result.stderr and "backend" in result.stderr


def test_refused_keys_exit_2_with_one_error_line_each(tmp_path: Path) -> None:
    source = tmp_path / "sgd.yaml"
    source.write_text(
        f"defaults: {REPO / MATH}\npolicy:\n  optimizer: {{name: torch.optim.SGD}}\n  lora: {{enabled: true}}\n"
    )
    output = tmp_path / "out.yaml"
    result = _asyncppo("config", "port", str(source), "-o", str(output))
    assert result.returncode == 2 and not output.exists()
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        "error: policy.optimizer.name: refused: 'torch.optim.SGD': asyncppo trains with AdamW only (torch.optim.AdamW)",
        "error: policy.lora.enabled: refused: True: no asyncppo key of this name or meaning",
    ]


def test_a_port_that_fails_validation_exits_2(tmp_path: Path) -> None:
    # Generators on both nodes of a two-node cluster leave the trainers none: the port maps, validation refuses.
    source = tmp_path / "two_nodes.yaml"
    source.write_text(
        f"defaults: {REPO / GYM}\npolicy:\n  generation:\n    colocated:\n      resources: {{num_nodes: 2}}\n"
    )
    result = _asyncppo("config", "port", str(source))
    assert result.returncode == 2
    assert (
        "error: generation.colocated.resources.num_nodes: 2 whole nodes for generators leave none of "
        "cluster.num_nodes=2 for the trainers" in result.stderr
    )
