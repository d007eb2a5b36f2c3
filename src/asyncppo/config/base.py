"""The base class of every config section: strict, documented, immutable.

Every section forbids unknown keys (so a typo never becomes a silent default) and takes each field's
description from the docstring written under it, which `asyncppo config keys` prints.
"""

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A config section: unknown keys are errors, fields are documented by their docstrings, values are frozen."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
        validate_default=True,
        protected_namespaces=(),
    )

    def provided(self, field_name: str) -> bool:
        """Whether the key was written in the config (as opposed to taken from the schema default)."""
        return field_name in self.model_fields_set


class RuleError(ValueError):
    """A broken config rule, tied to the key it is about.

    `key` is dotted and relative to the section whose validator raised it; the loader prefixes the
    section's own path so the user sees the full key path (`ppo.adv_estimator.gae_lambda: ...`).
    """

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message
