"""Rebuild the demo policies the package ships (src/asyncppo/demo/policies/) from their current recipes.

    python scripts/build_demo_policies.py            # build what is missing, remove stale builds
    python scripts/build_demo_policies.py --rebuild  # build every demo policy again

Run it after changing a warm-up recipe or its BUILD_VERSION (tests/demo/test_policy_builds.py fails until the
shipped builds match the recipes). Each build takes one to two minutes on 2 CPU cores and runs the same code a
run without a shipped build would.
"""

import argparse
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from asyncppo.demo import arithmetic_policy, tool_policy
from asyncppo.demo.shipped import SHIPPED_POLICIES

DEMOS: dict[str, tuple[Callable[[Path], Path], str]] = {
    "arithmetic": (
        arithmetic_policy.ensure_arithmetic_policy,
        arithmetic_policy.arithmetic_fingerprint(arithmetic_policy.ARITHMETIC_RECIPE),
    ),
    "multi_step": (tool_policy.ensure_tool_policy, tool_policy.tool_policy_fingerprint(tool_policy.TOOL_TASK_RECIPE)),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rebuild", action="store_true", help="build every demo policy again")
    args = parser.parse_args()
    SHIPPED_POLICIES.mkdir(exist_ok=True)
    for name, (ensure, fingerprint) in DEMOS.items():
        wanted = f"{name}-{fingerprint}"
        for old in SHIPPED_POLICIES.glob(f"{name}-*"):
            if old.name != wanted or args.rebuild:
                print(f"removing {old}")
                shutil.rmtree(old)
        target = SHIPPED_POLICIES / wanted
        if target.is_dir():
            print(f"up to date: {target}")
            continue
        with tempfile.TemporaryDirectory() as cache:
            built = ensure(Path(cache))  # nothing shipped for this fingerprint now: built in the cache
            shutil.copytree(built, target)
        print(f"shipped: {target}")


if __name__ == "__main__":
    main()
