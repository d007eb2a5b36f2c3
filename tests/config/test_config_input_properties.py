"""Property: whatever YAML file and dotted overrides `asyncppo config show` gets, it exits 0, or exits 2 with
`error: ...` lines on stderr; never an uncaught exception. Driven in-process through the CLI's own entry point."""

import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncppo.cli.main import main
from asyncppo.config import RunConfig
from asyncppo.config.schema_walk import iter_keys

DEMO_TREE: dict[str, Any] = yaml.safe_load((Path(__file__).parents[2] / "examples/configs/demo.yaml").read_text())
SCHEMA_KEYS = [path for path, _ in iter_keys(RunConfig)]
# Section paths too (an override may replace a whole section), and keys below the free-form dict.
KEY_PATHS = sorted({*SCHEMA_KEYS, *(key.rpartition(".")[0] for key in SCHEMA_KEYS if "." in key)})
FREE_FORM_KEYS = ["env.gym.agent_urls.foo", "env.gym.agent_urls.a.b"]

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=20)
    | st.sampled_from(["", "~", "null", "[", "{", "]", "&a", "*a", "!!timestamp x", "2001-13-45", "\ud800", "\x00"])
)
NAMES = st.sampled_from([key.rpartition(".")[2] for key in KEY_PATHS]) | st.text(max_size=8)
VALUES = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(NAMES, children, max_size=4),
    max_leaves=20,
)
# Text that hits PyYAML's edges: digits around Python's int-str limit (4300), nesting past the recursion limit.
# (Kept as text: hypothesis cannot print an int of that size when it reports a failure.)
EDGE_TEXT = st.integers(min_value=4290, max_value=4310).map(lambda digits: "9" * digits) | st.integers(
    min_value=1, max_value=1500
).map(lambda depth: "[" * depth + "]" * (depth % 2) * depth)
KEYS = st.sampled_from(KEY_PATHS + FREE_FORM_KEYS) | st.text(min_size=1, max_size=20).filter(
    lambda key: not key.startswith("-")
)


def _as_yaml(value: Any) -> str:
    """YAML text of a value; text PyYAML cannot emit (e.g. a lone surrogate) stays the raw string."""
    try:
        return yaml.safe_dump(value, default_flow_style=True).removesuffix("\n...\n").strip()
    except yaml.YAMLError:
        return str(value)


@st.composite
def config_texts(draw: st.DrawFn) -> str:
    """A config file's text: the demo config with random values at schema paths, a random document, raw text."""
    kind = draw(st.sampled_from(["demo", "document", "text"]))
    if kind == "text":
        return draw(st.text(max_size=200) | EDGE_TEXT.map(lambda text: f"ppo:\n  ppo_epochs: {text}\n"))
    if kind == "document":
        return _as_yaml(draw(VALUES))
    tree = yaml.safe_load(yaml.safe_dump(DEMO_TREE))
    for path in draw(st.lists(st.sampled_from(KEY_PATHS), max_size=3)):
        node = tree
        *sections, name = path.split(".")
        for section in sections:
            node = node.setdefault(section, {}) if isinstance(node.get(section), dict | None) else {}
        node[name] = draw(VALUES)
    return _as_yaml(tree)


OVERRIDES = st.lists(
    st.builds(lambda key, value: f"{key}={value}", KEYS, st.text(max_size=30) | VALUES.map(_as_yaml) | EDGE_TEXT),
    max_size=3,
)


def _assert_exit_0_or_one_error_per_line(argv: list[str], capsys) -> None:
    capsys.readouterr()
    status = main(argv)
    stderr = capsys.readouterr().err
    assert status in (0, 2), (status, stderr)
    if status == 2:
        lines = stderr.splitlines()
        assert lines and all(line.startswith("error: ") for line in lines), stderr


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=config_texts(), overrides=OVERRIDES)
def test_config_show_never_raises_on_any_file_or_override(text, overrides, capsys):
    with tempfile.TemporaryDirectory() as directory:
        config = Path(directory) / "config.yaml"
        config.write_text(text, encoding="utf-8", errors="surrogateescape")
        _assert_exit_0_or_one_error_per_line(["config", "show", str(config), *overrides], capsys)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(overrides=OVERRIDES)
def test_overrides_on_the_demo_config_exit_0_or_2(overrides, capsys):
    demo = str(Path(__file__).parents[2] / "examples/configs/demo.yaml")
    _assert_exit_0_or_one_error_per_line(["config", "show", demo, *overrides], capsys)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=200))
def test_any_bytes_as_a_config_file_exit_0_or_2(data, capsys):
    with tempfile.TemporaryDirectory() as directory:
        config = Path(directory) / "config.yaml"
        config.write_bytes(data)
        _assert_exit_0_or_one_error_per_line(["config", "show", str(config)], capsys)
