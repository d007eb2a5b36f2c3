"""Values a config must not hold, each refused with one line naming the key or the file: infinities and NaN
where a number means something finite, a seed past 64 bits, a lower ratio clip whose bound (1 - ratio_clip_min)
would be negative, a key written twice in one mapping, a config file too large to be one."""

from pathlib import Path

import pytest

from asyncppo.config import ConfigError, load_config
from asyncppo.config.loading import MAX_CONFIG_BYTES

DEMO = Path(__file__).parents[2] / "examples" / "configs" / "demo.yaml"


@pytest.mark.parametrize(
    ("override", "line"),
    [
        ("model.optimizer.lr=.inf", "model.optimizer.lr: Input should be a finite number (got inf)"),
        ("loss_fn.ratio_clip_max=.nan", "loss_fn.ratio_clip_max: Input should be a finite number (got nan)"),
        (f"ppo.seed={2**70}", f"ppo.seed: Input should be less than or equal to {2**63 - 1} (got {2**70})"),
        ("ppo.seed=-1", "ppo.seed: Input should be greater than or equal to 0 (got -1)"),
        # 1 is allowed: the lower clip at 0, which NeMo-RL's CISPO recipe sets.
        ("loss_fn.ratio_clip_min=2", "loss_fn.ratio_clip_min: Input should be less than or equal to 1 (got 2)"),
    ],
)
def test_a_value_that_means_nothing_is_one_line_naming_its_key(override: str, line: str):
    with pytest.raises(ConfigError) as raised:
        load_config(DEMO, [override])
    assert raised.value.lines == [line]


def test_a_key_written_twice_names_both_lines(tmp_path: Path):
    path = tmp_path / "run.yaml"
    path.write_text(f"defaults: {DEMO}\nppo:\n  seed: 1\n  max_num_steps: 3\n  seed: 2\n")
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert raised.value.lines == [
        f"{path}: not valid YAML (duplicate key 'seed' (first on line 3) at line 5, column 3)"
    ]


def test_a_config_file_over_one_mebibyte_is_refused_unread(tmp_path: Path):
    path = tmp_path / "huge.yaml"
    path.write_text("# padding\n" * (MAX_CONFIG_BYTES // 10 + 1))
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    size = path.stat().st_size
    assert raised.value.lines == [f"{path}: config file of {size} bytes; expected at most {MAX_CONFIG_BYTES} (1 MiB)"]
