"""Walking the config schema by dotted key path: field lookup, close-match suggestions, key listings.

Used by the loader (typed overrides, unknown-key errors) and by `asyncppo config keys`.
"""

import difflib
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo


@dataclass(frozen=True)
class FieldAt:
    """A field found at a dotted path: its info, its section class, and whether keys below it are free-form."""

    path: str
    info: FieldInfo
    section: type[BaseModel] | None
    free_form: bool


class UnknownKeyError(KeyError):
    """A dotted path that names no field; `message` is the one line shown to the user."""

    def __init__(self, path: str, message: str):
        super().__init__(path)
        self.path = path
        self.message = message


def _annotation_members(annotation: Any) -> list[Any]:
    """The non-None members of a (possibly optional / union) annotation."""
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        return [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    return [annotation]


def section_of(annotation: Any) -> type[BaseModel] | None:
    """The config section class an annotation holds, if any."""
    for member in _annotation_members(annotation):
        if isinstance(member, type) and issubclass(member, BaseModel):
            return member
    return None


def is_free_form(annotation: Any) -> bool:
    """Whether the annotation is a dict, whose keys the schema does not constrain."""
    return any(member is dict or typing.get_origin(member) is dict for member in _annotation_members(annotation))


def accepts_plain_string(annotation: Any) -> bool:
    """Whether a raw override string should be kept as text (str fields and string Literals)."""
    for member in _annotation_members(annotation):
        if member is str:
            return True
        if typing.get_origin(member) is typing.Literal and all(isinstance(a, str) for a in typing.get_args(member)):
            return True
    return False


def suggest(path_prefix: str, name: str, candidates: list[str]) -> str:
    """A ' (did you mean ...?)' suffix for the closest candidate, or ''."""
    matches = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    if not matches:
        return ""
    return f"; did you mean '{path_prefix}{matches[0]}'?"


def find_field(root: type[BaseModel], dotted_path: str) -> FieldAt:
    """Resolve `a.b.c` against the schema; raises UnknownKeyError naming the full path and a close match."""
    section: type[BaseModel] | None = root
    parts = dotted_path.split(".")
    found: FieldAt | None = None
    for depth, name in enumerate(parts):
        prefix = ".".join(parts[:depth])
        prefix = f"{prefix}." if prefix else ""
        if found is not None and found.free_form:
            return found
        if section is None:
            raise UnknownKeyError(dotted_path, f"{dotted_path}: unknown key ({prefix[:-1]} is a value, not a section)")
        fields = section.model_fields
        if name not in fields:
            hint = suggest(prefix, name, list(fields))
            raise UnknownKeyError(dotted_path, f"{dotted_path}: unknown key{hint}")
        info = fields[name]
        found = FieldAt(
            path=prefix + name,
            info=info,
            section=section_of(info.annotation),
            free_form=is_free_form(info.annotation),
        )
        section = found.section
    assert found is not None
    return found


def iter_keys(section: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, FieldInfo]]:
    """Every leaf key of the schema with its field info, depth first, in declaration order."""
    for name, info in section.model_fields.items():
        child = section_of(info.annotation)
        path = f"{prefix}{name}"
        if child is None:
            yield path, info
        else:
            yield from iter_keys(child, f"{path}.")
