"""The layer rule: imports only go downward (README's layout table), and low layers stay free of frameworks.

The checker reads import statements with `ast` (nothing is imported): plain and relative imports and
`importlib` calls with a literal module name. So it also runs on synthetic packages, in tests that prove it
catches each kind of violation.
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
    "demo": 0,
    "generation": 1,
    "gym": 1,
    "rollout": 1,
    "checkpoint": 1,
    "metrics": 1,
    "pipeline": 2,
    "distributed": 2,
    "workers": 3,
    "trainer": 4,
    "cli": 5,
}
# Third-party packages a layer may not import below the layer that owns them: layer 0 is torch, transformers,
# pydantic and data formats only; HTTP, plotting, experiment trackers and kernels start at the adapters.
FIRST_LAYER_ALLOWED = {
    "ray": 3,
    **dict.fromkeys(["fastapi", "uvicorn", "httpx", "starlette", "aiohttp", "requests"], 1),
    **dict.fromkeys(["wandb", "mlflow", "matplotlib", "rich", "PIL"], 1),
    **dict.fromkeys(["triton", "vllm", "sglang", "math_verify"], 1),
}
ROOT_MODULES = {"__init__", "__main__"}


def _literal_import_call(node: ast.Call) -> str | None:
    """The module of `importlib.import_module("x")`, `import_module("x")` or `__import__("x")`; else None."""
    function = node.func
    name = (
        function.attr if isinstance(function, ast.Attribute) else function.id if isinstance(function, ast.Name) else ""
    )
    if name not in ("import_module", "__import__") or not node.args:
        return None
    first = node.args[0]
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None


def _imported_modules(tree: ast.AST, module_path: tuple[str, ...], package: str) -> list[tuple[int, str]]:
    """(line, absolute module) of every import: plain, relative (resolved from `module_path`, the importing
    module's dotted path inside `package`) and importlib calls with a literal name."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if node.module:
                    found.append((node.lineno, node.module))
                continue
            base = (package, *module_path[: len(module_path) - node.level])
            targets = [node.module] if node.module else [alias.name for alias in node.names]
            found.extend((node.lineno, ".".join((*base, target))) for target in targets)
        elif isinstance(node, ast.Call) and (module := _literal_import_call(node)):
            found.append((node.lineno, module))
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
        module_path = (*relative.parts[:-1], relative.stem)
        for line, module in _imported_modules(ast.parse(path.read_text(), str(path)), module_path, package):
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


def test_the_checker_resolves_relative_imports(tmp_path):
    package = tmp_path / "asyncppo"
    (package / "pipeline").mkdir(parents=True)
    (package / "pipeline" / "buffer.py").write_text(
        "from . import accounting\n"
        "from .accounting import Ledger\n"
        "from ..workers import remote\n"
        "from ..types import TrainBatch\n"
    )
    assert find_layer_violations(package) == ["pipeline/buffer.py:3: layer 2 imports asyncppo.workers (layer 3)"]


def test_the_checker_catches_importlib_of_an_upper_layer(tmp_path):
    package = tmp_path / "asyncppo"
    (package / "rollout").mkdir(parents=True)
    (package / "rollout" / "rewards.py").write_text(
        "import importlib\n"
        "runner = importlib.import_module('asyncppo.trainer.run')\n"
        "gae = importlib.import_module('asyncppo.algorithms.gae')\n"
        "user = importlib.import_module(user_module)\n"  # a name only known at run time: not checked
        "server = __import__('asyncppo.workers.groups')\n"
    )
    assert find_layer_violations(package) == [
        "rollout/rewards.py:2: layer 1 imports asyncppo.trainer.run (layer 4)",
        "rollout/rewards.py:5: layer 1 imports asyncppo.workers.groups (layer 3)",
    ]


def test_the_checker_catches_http_and_plotting_packages_in_layer_zero(tmp_path):
    package = tmp_path / "asyncppo"
    (package / "config").mkdir(parents=True)
    (package / "config" / "loader.py").write_text("import yaml\nimport httpx\nfrom matplotlib import pyplot\n")
    (package / "gym").mkdir()
    (package / "gym" / "client.py").write_text("import httpx\n")
    assert find_layer_violations(package) == [
        "config/loader.py:2: layer 0 imports httpx",
        "config/loader.py:3: layer 0 imports matplotlib",
    ]
