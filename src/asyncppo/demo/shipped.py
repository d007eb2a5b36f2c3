"""The demo policies shipped inside the package, so neither a demo run nor the test suite spends a warm-up's
minutes of CPU on them.

`policies/<name>-<fingerprint>/` holds the build of each demo policy's current recipe (model, tokenizer and the
warm-up's report, `warmup.json`), written by `scripts/build_demo_policies.py` with the same code a run would use.
A recipe whose fingerprint has no shipped build (a changed recipe, a test's quick one) is built into the cache on
first use, as before; a test checks that every current recipe has its shipped build and no stale one is left.
"""

from collections.abc import Callable
from pathlib import Path

from asyncppo.models.build_cache import build_once

SHIPPED_POLICIES = Path(__file__).parent / "policies"


def shipped_or_built(final: Path, build: Callable[[Path], object], announce: str) -> Path:
    """The shipped build named like `final` when the package holds one, else `final` built once in the cache."""
    shipped = SHIPPED_POLICIES / final.name
    if (shipped / "config.json").is_file() and (shipped / "model.safetensors").is_file():
        return shipped
    return build_once(final, build, announce)
