"""The Python API (`asyncppo.load_config`, `asyncppo.train`): a light `import asyncppo`, overrides given as a dict
of typed values, its errors, and README's "Python API" example run verbatim on the tiny model."""

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from in_process import REPO

import asyncppo
from asyncppo import ConfigError

DEMO = str(REPO / "examples" / "configs" / "demo.yaml")


def test_import_asyncppo_and_load_config_import_neither_torch_transformers_nor_ray():
    check = (
        "import sys; import asyncppo; "
        "assert 'asyncppo.api' not in sys.modules, 'import asyncppo loaded the API'; "
        "assert {'train', 'load_config', 'check'} <= set(dir(asyncppo)); "
        f"config = asyncppo.load_config({DEMO!r}, overrides={{'ppo.max_num_steps': 2}}); "
        "assert config.ppo.max_num_steps == 2; "
        "loaded = [m for m in ('torch', 'transformers', 'ray') if m in sys.modules]; "
        "assert not loaded, loaded"
    )
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def test_a_dict_of_typed_values_loads_the_config_the_command_line_strings_load():
    typed = {
        "ppo.max_num_steps": 2,
        "ppo.val_at_start": False,
        "model.optimizer.lr": 1e-10,
        "generation.stop_token_ids": [5, 7],
        "ppo.seq_logprob_error_threshold": None,
        "data.train_path": Path("rows with spaces.jsonl"),
        "logger.log_dir": "runs/x: y",  # a string is taken as the command line takes it: text for a text key
    }
    strings = [
        "ppo.max_num_steps=2",
        "ppo.val_at_start=false",
        "model.optimizer.lr=1.0e-10",
        "generation.stop_token_ids=[5, 7]",
        "ppo.seq_logprob_error_threshold=null",
        "data.train_path=rows with spaces.jsonl",
        "logger.log_dir=runs/x: y",
    ]
    config = asyncppo.load_config(DEMO, overrides=typed)
    assert config == asyncppo.load_config(DEMO, overrides=strings)
    assert (config.model.optimizer.lr, config.generation.stop_token_ids) == (1e-10, [5, 7])
    assert (config.ppo.seq_logprob_error_threshold, config.data.train_path) == (None, "rows with spaces.jsonl")


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        pytest.param({"ppo.max_num_stepz": 2}, "ppo.max_num_stepz: unknown key; did you mean 'ppo.max_num_steps'?"),
        pytest.param({"ppo.max_num_steps": "two"}, "ppo.max_num_steps: Input should be a valid integer"),
        pytest.param({"ppo.max_num_steps": object()}, "ppo.max_num_steps: <object object at"),
        pytest.param({3: 2}, "overrides: the key 3 is not a string; expected a dotted key like 'ppo.ppo_epochs'"),
        pytest.param("ppo.max_num_steps=2", "overrides: got the string 'ppo.max_num_steps=2'; expected a dict"),
        pytest.param([2], "overrides: 2 is not a 'key=value' string"),
    ],
    ids=["unknown_key", "wrong_type", "not_yaml", "key_not_a_string", "bare_string", "list_of_non_strings"],
)
def test_an_override_mistake_is_one_config_error_line_naming_it(overrides: Any, line: str):
    with pytest.raises(ConfigError) as raised:
        asyncppo.load_config(DEMO, overrides=overrides)
    assert len(raised.value.lines) == 1
    assert raised.value.lines[0].startswith(line)


def test_overrides_for_an_already_validated_config_are_refused():
    config = asyncppo.load_config(DEMO)
    with pytest.raises(ConfigError, match=r"^overrides: a RunConfig is already validated; give them to load_config"):
        asyncppo.train(config, overrides={"ppo.max_num_steps": 2})


def _readme_example() -> str:
    """The first python code block of README.md's "## Python API" section."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("\n## Python API\n", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found, "README's Python API section has no python code block"
    return found.group(1)


@pytest.mark.integration
@pytest.mark.slow
def test_the_readme_example_trains_and_reports_its_result(
    ray_cluster: None,
    shared_cache_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
):
    monkeypatch.setenv("ASYNCPPO_CACHE_DIR", str(shared_cache_dir))
    # Run where the example's relative paths find the repository's examples/ and its run directory lands in tmp.
    (tmp_path / "examples").symlink_to(REPO / "examples")
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {}
    exec(compile(_readme_example(), "README.md (Python API)", "exec"), namespace)
    result = namespace["result"]
    assert (result.exit_status, result.finished, result.stopped) == (0, True, None)
    assert result.run_dir == tmp_path / "runs" / "api_try"
    # The workers' part of the last checkpoint (the weights) is there too, though the session's Ray cluster started
    # in another working directory.
    assert (result.run_dir / "checkpoints" / "step_2" / "policy" / "model.safetensors").is_file()
    assert [record["step"] for record in result.metrics][-2:] == [1, 2]
    assert result.last_metrics == result.metrics[-1]
    assert result.report == result.run_dir / "report.html" and result.report.is_file()
    printed = capsys.readouterr().out.splitlines()[-1]
    assert printed == f"0 {result.run_dir} {result.last_metrics['train/reward_mean']}"
    # The session's Ray cluster was the caller's: the run used it and left it up for the next test.
    import ray

    assert ray.is_initialized()
