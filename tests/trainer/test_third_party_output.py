"""Third-party console output: progress bars and Ray's token notice off by default, untouched with
`logger.verbose=true` (a config key the train command reads)."""

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import huggingface_hub.utils
import pytest
import transformers.utils.logging

from asyncppo.config import load_config
from asyncppo.trainer.third_party_output import (
    PROGRESS_BARS_ENV,
    RAY_TOKEN_NOTICE_LOGGER,
    quiet_third_party_output,
)

DEMO_CONFIG = Path(__file__).parents[2] / "examples" / "configs" / "demo.yaml"


@pytest.fixture
def fresh_process_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Bars on, no env setting, Ray's notice logger unset; all put back afterwards."""
    monkeypatch.delenv(PROGRESS_BARS_ENV, raising=False)
    notice_logger = logging.getLogger(RAY_TOKEN_NOTICE_LOGGER)
    level = notice_logger.level
    transformers.utils.logging.enable_progress_bar()
    huggingface_hub.utils.enable_progress_bars()
    notice_logger.setLevel(logging.NOTSET)
    yield
    transformers.utils.logging.enable_progress_bar()
    huggingface_hub.utils.enable_progress_bars()
    notice_logger.setLevel(level)


def test_logger_verbose_is_off_by_default_and_set_from_the_command_line():
    assert load_config(DEMO_CONFIG).logger.verbose is False
    assert load_config(DEMO_CONFIG, ["logger.verbose=true"]).logger.verbose is True


@pytest.mark.usefixtures("fresh_process_state")
def test_by_default_progress_bars_and_the_ray_token_notice_are_off():
    quiet_third_party_output(verbose=False)
    assert not transformers.utils.logging.is_progress_bar_enabled()
    assert huggingface_hub.utils.are_progress_bars_disabled()
    # Ray's local workers inherit the environment: transformers reads this when a worker imports it.
    assert os.environ[PROGRESS_BARS_ENV] == "1"
    notice_logger = logging.getLogger(f"{RAY_TOKEN_NOTICE_LOGGER}.authentication_token_setup")
    assert not notice_logger.isEnabledFor(logging.WARNING)
    assert notice_logger.isEnabledFor(logging.ERROR)


@pytest.mark.usefixtures("fresh_process_state")
def test_verbose_leaves_everything_as_it_was():
    quiet_third_party_output(verbose=True)
    assert transformers.utils.logging.is_progress_bar_enabled()
    assert PROGRESS_BARS_ENV not in os.environ
    assert logging.getLogger(f"{RAY_TOKEN_NOTICE_LOGGER}.authentication_token_setup").isEnabledFor(logging.WARNING)


@pytest.mark.usefixtures("fresh_process_state")
def test_a_progress_bar_setting_of_the_user_is_kept(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(PROGRESS_BARS_ENV, "0")
    quiet_third_party_output(verbose=False)
    assert transformers.utils.logging.is_progress_bar_enabled()
