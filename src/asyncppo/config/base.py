"""The base class of every config section: strict, documented, immutable.

Every section forbids unknown keys (so a typo never becomes a silent default) and takes each field's
description from the docstring written under it, which `asyncppo config keys` prints.
"""

from typing import cast

from pydantic import BaseModel, ConfigDict, ValidationInfo

NOTES_CONTEXT_KEY = "notes"
"""Key of the validation context list that collects notes (`validate_tree` passes one and prints it)."""


class Section(BaseModel):
    """A config section: unknown keys are errors, fields are documented by their docstrings, values are frozen."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        # No setting means anything at infinity or NaN (a learning rate, a clip bound, a threshold): refused.
        allow_inf_nan=False,
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


def add_note(info: ValidationInfo, text: str) -> None:
    """Tell the user about a key the loader accepted but does not use, with why (one line, shown on stderr).

    Notes go to the list `validate_tree` passes in the validation context; validation without one (a direct
    `RunConfig.model_validate`) applies the same rule silently.
    """
    # The context is untyped (isinstance leaves key and item types unknown); `validate_tree` passes a dict whose
    # NOTES_CONTEXT_KEY entry is a list[str].
    context = info.context
    notes = cast(dict[str, object], context).get(NOTES_CONTEXT_KEY) if isinstance(context, dict) else None
    if isinstance(notes, list):
        cast(list[str], notes).append(text)
