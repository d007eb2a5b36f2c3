"""data.prompt_file (a template with one `{}` for the plain-text prompt) and data.system_prompt_file: read and
checked by the pre-flight, each mistake one config error naming the key and the file, and applied by single-turn
rollouts to plain-text prompts only."""

from pathlib import Path

import pytest

from asyncppo.config import ConfigError, load_config
from asyncppo.data.prompt_files import PromptTexts, prompt_texts
from asyncppo.rollout.single_turn import prompt_messages
from asyncppo.trainer.preflight import load_data

DEMO = Path(__file__).parents[2] / "examples" / "configs" / "demo.yaml"
GYM = Path(__file__).parents[2] / "examples" / "configs" / "gym_multi_step.yaml"


def _texts(config_file: Path, *overrides: str) -> PromptTexts:
    config = load_config(config_file, list(overrides))
    return prompt_texts(config.data, config.env.should_use_nemo_gym)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_the_template_and_the_system_prompt_file_are_read_whole(tmp_path: Path):
    # `{{}}` is a literal `{}` (Python format strings, as NeMo-RL's prompt files are written).
    template = _write(tmp_path / "cot.txt", "Think step by step, then write \\boxed{{}}.\n{}\n")
    system = _write(tmp_path / "system.txt", "You are a careful solver.\n")
    texts = _texts(DEMO, f"data.prompt_file={template}", f"data.system_prompt_file={system}")
    assert texts == PromptTexts("You are a careful solver.\n", "Think step by step, then write \\boxed{{}}.\n{}\n")
    messages = prompt_messages(
        {"prompt": "What is 2+3?"},
        0,
        system_prompt=texts.system_prompt,
        prompt_key="prompt",
        messages_key="messages",
        prompt_template=texts.prompt_template,
    )
    assert messages == [
        {"role": "system", "content": "You are a careful solver.\n"},
        {"role": "user", "content": "Think step by step, then write \\boxed{}.\nWhat is 2+3?\n"},
    ]


def test_chat_rows_are_not_templated(tmp_path: Path):
    chat = [{"role": "user", "content": "Hi {}"}]
    row = {"messages": chat}
    assert (
        prompt_messages(
            row, 0, system_prompt="S", prompt_key="prompt", messages_key="messages", prompt_template="T: {}"
        )
        == chat
    )


def test_without_files_the_inline_system_prompt_is_used():
    assert _texts(DEMO, "data.system_prompt=Be brief.") == PromptTexts("Be brief.", None)
    assert _texts(DEMO) == PromptTexts(None, None)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        pytest.param(
            "Solve it.", "must hold exactly one {} where the prompt goes and no other field; it holds 0: []", id="none"
        ),
        pytest.param(
            "{}\n{}",
            "must hold exactly one {} where the prompt goes and no other field; it holds 2: ['{}', '{}']",
            id="two",
        ),
        pytest.param(
            "Q: {question}",
            "must hold exactly one {} where the prompt goes and no other field; it holds 1: ['{question}']",
            id="named",
        ),
        pytest.param(
            "\\boxed{} {}",
            "must hold exactly one {} where the prompt goes and no other field; it holds 2: ['{}', '{}']",
            id="unescaped_braces",
        ),
        pytest.param("Q: {", "is not a prompt template (Single '{' encountered in format string)", id="unbalanced"),
    ],
)
def test_a_template_without_exactly_one_placeholder_names_the_key_and_the_file(tmp_path: Path, text: str, problem: str):
    template = _write(tmp_path / "prompt.txt", text)
    with pytest.raises(ConfigError) as raised:
        _texts(DEMO, f"data.prompt_file={template}")
    assert raised.value.lines == [
        f"data.prompt_file: {str(template)!r} {problem}; write literal braces as {{{{ and }}}}"
    ]


def test_a_missing_system_prompt_file_fails_the_preflight_before_any_row_is_read(tmp_path: Path):
    missing = tmp_path / "system.txt"
    with pytest.raises(ConfigError) as raised:
        load_data(load_config(DEMO, [f"data.system_prompt_file={missing}"]))
    assert raised.value.lines == [
        f"data.system_prompt_file: {str(missing)!r} does not exist (relative paths resolve from {Path.cwd()})"
    ]


def test_gym_runs_refuse_prompt_files(tmp_path: Path):
    template = _write(tmp_path / "prompt.txt", "Q: {}")
    with pytest.raises(ConfigError) as raised:
        _texts(GYM, f"data.prompt_file={template}")
    assert raised.value.lines == [
        "data.prompt_file: gym rows carry their own input, so data.prompt_file does not apply; remove it"
    ]
