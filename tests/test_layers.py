"""The layer rule of DESIGN.md section 2: imports only go downward, and layer 0 stays free of I/O frameworks.

The checker reads import statements with `ast` (nothing is imported), so it also runs on a synthetic
package in a test that proves it catches a violation.
"""

import ast
from pathlib import Path

SRC = Path(__file__).parents[1] / "src" / "asyncppo"

# Layer of each top-level module or package of asyncppo.
LAYERS = {
    "types": 0,
    "config": 0,
    "algorithms": 0,
    "data": 0,
    "models": 0,
    "generation": 1,
    "gym": 1,
    "rollout": 1,
    "checkpoint": 1,
    "metrics": 1,
    "pipeline": 2,
    "distributed": 2,
    "workers": 3,
    "cli": 4,
}
# Third-party packages a layer may not import below the layer that owns them.
FIRST_LAYER_ALLOWED = {"ray": 3, "fastapi": 1, "uvicorn": 1, "httpx": 1, "starlette": 1, "vllm": 1, "sglang": 1}
ROOT_MODULES = {"__init__", "__main__"}


def _imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def find_layer_violations(package_root: Path, package: str = "asyncppo") -> list[str]:
    """One message per import that goes up a layer or pulls a framework into a layer below its home."""
    violations = []
    for path in sorted(package_root.rglob("*.py")):
        relative = path.relative_to(package_root)
        owner = relative.parts[0].removesuffix(".py")
        if owner in ROOT_MODULES:
            continue
        assert owner in LAYERS, f"{relative}: module outside the known layers; add it to LAYERS"
        layer = LAYERS[owner]
        for line, module in _imported_modules(ast.parse(path.read_text(), str(path))):
            top, _, rest = module.partition(".")
            if top == package:
                target = rest.split(".")[0] if rest else ""
                if target in LAYERS and LAYERS[target] > layer:
                    violations.append(f"{relative}:{line}: layer {layer} imports {module} (layer {LAYERS[target]})")
            elif top in FIRST_LAYER_ALLOWED and layer < FIRST_LAYER_ALLOWED[top]:
                violations.append(f"{relative}:{line}: layer {layer} imports {module}")
    return violations


def test_asyncppo_imports_only_go_downward():
    assert find_layer_violations(SRC) == []


def test_the_checker_catches_ray_in_layer_zero(tmp_path):
    package = tmp_path / "asyncppo"
    (package / "algorithms").mkdir(parents=True)
    (package / "algorithms" / "gae.py").write_text("import torch\nfrom ray import remote\n")
    (package / "workers").mkdir()
    (package / "workers" / "policy.py").write_text("import ray\nfrom asyncppo.algorithms import gae\n")
    assert find_layer_violations(package) == ["algorithms/gae.py:2: layer 0 imports ray"]


def test_the_checker_catches_an_upward_import(tmp_path):
    package = tmp_path / "asyncppo"
    (package / "models").mkdir(parents=True)
    (package / "models" / "policy.py").write_text("from asyncppo.workers.policy import PolicyWorker\n")
    assert find_layer_violations(package) == ["models/policy.py:1: layer 0 imports asyncppo.workers.policy (layer 3)"]
