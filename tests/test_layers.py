"""The layer rule: imports only go downward (README's layout table), one way between the packages of a layer, and
never in a cycle between modules; low layers stay free of frameworks.

The checker reads import statements with `ast` (nothing is imported): plain, relative and package-level
(`from asyncppo import trainer`) imports and `importlib` calls with a literal module name, wherever they stand (in
functions and under `if TYPE_CHECKING:` too). So it also runs on synthetic packages, and on copies of the tree with
one bad import planted, in tests that prove it catches each kind of violation.
"""

import ast
import functools
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

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
    "api": 5,
    "cli": 5,
}
# The direction inside a layer, bottom tier first: a package imports packages of a lower tier of its own layer, never
# one of its own tier or above. The tiers hold the edges the tree has (config -> types; algorithms -> config;
# demo -> data, models; rollout -> generation; gym -> generation, rollout; cli -> api), so a new edge inside a layer
# is decided here. Layers 3 and 4 hold one package each; api is the module api.py (`asyncppo.train`).
TIERS_IN_LAYER = {
    0: [{"types"}, {"config"}, {"algorithms", "data", "models"}, {"demo"}],
    1: [{"checkpoint", "generation", "metrics"}, {"rollout"}, {"gym"}],
    2: [{"distributed", "pipeline"}],
    5: [{"api"}, {"cli"}],
}
TIER = {
    package: tier for tiers in TIERS_IN_LAYER.values() for tier, packages in enumerate(tiers) for package in packages
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

Import = tuple[int, str, tuple[str, ...]]
"""(line, absolute module, names a from-import takes from it: attributes or submodules)."""


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


def _imports(tree: ast.AST, module_path: tuple[str, ...], package: str) -> Iterator[Import]:
    """Every import: plain, relative (resolved from `module_path`, the importing module's dotted path inside
    `package`) and importlib calls with a literal name. A from-import of a package itself (`from asyncppo import
    trainer`, `from .. import trainer`, `from . import buffer`) names its submodules, so each name is its own module
    (`asyncppo.trainer`)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name, ()) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = (package, *module_path[: len(module_path) - node.level]) if node.level else ()
            module = ".".join((*base, *([node.module] if node.module else [])))
            names = tuple(alias.name for alias in node.names)
            if node.module is None or module == package:
                yield from ((node.lineno, f"{module}.{name}", ()) for name in names)
            else:
                yield (node.lineno, module, names)
        elif isinstance(node, ast.Call) and (module := _literal_import_call(node)):
            yield (node.lineno, module, ())


@functools.cache
def _imports_of_source(source: str, module_path: tuple[str, ...], package: str) -> tuple[Import, ...]:
    """`_imports` of one module's text. Cached: the planted-copy tests read the same files once per case, and
    parsing the tree takes about a second."""
    return tuple(_imports(ast.parse(source), module_path, package))


def _read(package_root: Path, package: str) -> dict[str, tuple[Import, ...]]:
    """Path relative to the package root -> its imports, for every module, in path order."""
    modules = {}
    for path in sorted(package_root.rglob("*.py")):
        relative = path.relative_to(package_root)
        module_path = (*relative.parts[:-1], relative.stem)
        modules[relative.as_posix()] = _imports_of_source(path.read_text(), module_path, package)
    return modules


def find_layer_violations(package_root: Path, package: str = "asyncppo") -> list[str]:
    """One message per import that goes up a layer, against its layer's tiers, or pulls a framework into a layer
    below its home."""
    violations = []
    for relative, imports in _read(package_root, package).items():
        owner = relative.split("/")[0].removesuffix(".py")
        if owner in ROOT_MODULES:
            continue
        assert owner in LAYERS, f"{relative}: module outside the known layers; add it to LAYERS"
        layer = LAYERS[owner]
        for line, module, _ in imports:
            top, _, rest = module.partition(".")
            target = rest.split(".")[0]
            if top == package and target in LAYERS and LAYERS[target] > layer:
                violations.append(f"{relative}:{line}: layer {layer} imports {module} (layer {LAYERS[target]})")
            elif top == package and target != owner and LAYERS.get(target) == layer and TIER[target] >= TIER[owner]:
                violations.append(
                    f"{relative}:{line}: {owner} (layer {layer}, tier {TIER[owner]}) imports {module} "
                    f"(tier {TIER[target]}); inside a layer imports go to a lower tier"
                )
            elif top in FIRST_LAYER_ALLOWED and layer < FIRST_LAYER_ALLOWED[top]:
                violations.append(f"{relative}:{line}: layer {layer} imports {module}")
    return violations


def _import_graph(package_root: Path, package: str) -> dict[str, dict[str, int]]:
    """Module -> {module of the package it imports: the line of the first such import}, by paths relative to the
    root. An import names the deepest module its dotted name reaches (`from asyncppo.config import ConfigError`:
    config/__init__.py; `from asyncppo.workers import ray_host`: workers/ray_host.py). The package `__init__` that
    Python runs before a submodule is no edge: then every module of a package whose `__init__` re-exports (config/,
    checkpoint/, metrics/) and that imports a sibling would sit in a cycle with it."""
    read = _read(package_root, package)
    modules = {}
    for relative in read:
        parts = Path(relative).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join((package, *parts))] = relative
    graph: dict[str, dict[str, int]] = {}
    for relative, imports in read.items():
        edges = graph.setdefault(relative, {})
        for line, module, names in imports:
            for dotted in [f"{module}.{name}" for name in names] or [module]:
                while dotted and dotted not in modules:
                    dotted = dotted.rpartition(".")[0]
                if dotted and modules[dotted] != relative:
                    edges.setdefault(modules[dotted], line)
    return graph


def _strongly_connected(graph: dict[str, dict[str, int]]) -> list[set[str]]:
    """Tarjan's strongly connected components: each set of modules that reach each other through imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for successor in graph[node]:
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = set()
            while (member := stack.pop()) != node:
                component.add(member)
            components.append(component | {node})

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def _shortest_cycle(graph: dict[str, dict[str, int]], start: str, component: set[str]) -> list[str]:
    """The modules of a shortest cycle through `start` inside its component, in import order from `start`: a
    breadth-first search whose first path back to `start` is the shortest."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while start not in came_from:
        reached = []
        for node in frontier:
            for successor in sorted(graph[node]):
                if successor in component and successor not in came_from:
                    came_from[successor] = node
                    reached.append(successor)
        frontier = reached
    cycle = [came_from[start]]
    while cycle[0] != start:
        cycle.insert(0, came_from[cycle[0]])
    return cycle


def find_import_cycles(package_root: Path, package: str = "asyncppo") -> list[str]:
    """One message per set of modules that import each other, naming its shortest cycle through its first module
    with the line of each import: `a.py:3 -> b.py:7 -> a.py` (a.py's line 3 imports b.py, whose line 7 imports a.py).

    Imports under `if TYPE_CHECKING:` and inside functions count: they keep a cycle from failing at import time, not
    from being one (each module still needs the other, and neither can be read, tested or moved alone)."""
    graph = _import_graph(package_root, package)
    cycles = []
    for component in _strongly_connected(graph):
        if len(component) > 1:
            cycle = _shortest_cycle(graph, min(component), component)
            steps = [
                f"{module}:{graph[module][next_module]}"
                for module, next_module in zip(cycle, [*cycle[1:], cycle[0]], strict=True)
            ]
            cycles.append(f"import cycle: {' -> '.join(steps)} -> {cycle[0]}")
    return sorted(cycles)


def check_imports(package_root: Path, package: str = "asyncppo") -> list[str]:
    """Every layer, tier and framework violation, then every import cycle."""
    return find_layer_violations(package_root, package) + find_import_cycles(package_root, package)


def test_asyncppo_imports_only_go_downward():
    assert find_layer_violations(SRC) == []


def test_asyncppo_modules_import_each_other_in_no_cycle():
    assert find_import_cycles(SRC) == []


def test_the_tiers_of_each_layer_hold_exactly_its_packages():
    for layer in sorted(set(LAYERS.values())):
        packages = {package for package, its_layer in LAYERS.items() if its_layer == layer}
        tiers = TIERS_IN_LAYER.get(layer, [packages])
        assert set().union(*tiers) == packages, f"layer {layer}"
        assert sum(len(tier) for tier in tiers) == len(packages), f"layer {layer}: a package in two tiers"


# One bad import per case, planted in a copy of the real tree (a new module, or lines put first in an existing one so
# the expected line numbers do not depend on that file's length); the copy must then report exactly `expected`.
PLANTED = {
    "nothing planted": ({}, []),
    "package-level from-import": (
        {"config/planted.py": "from asyncppo import trainer\n"},
        ["config/planted.py:1: layer 0 imports asyncppo.trainer (layer 4)"],
    ),
    "relative package-level from-import": (
        {"data/planted.py": "from .. import types, trainer as run_driver\n"},
        ["data/planted.py:1: layer 0 imports asyncppo.trainer (layer 4)"],
    ),
    "import of an upper package under another name": (
        {"models/planted.py": "import asyncppo.trainer as run_driver\n"},
        ["models/planted.py:1: layer 0 imports asyncppo.trainer (layer 4)"],
    ),
    "adapter importing a higher tier of its layer": (
        {"generation/planted.py": "from asyncppo.gym.client import GymClient\n"},
        [
            "generation/planted.py:1: generation (layer 1, tier 0) imports asyncppo.gym.client (tier 2); inside a "
            "layer imports go to a lower tier"
        ],
    ),
    "core package importing one of its own tier": (
        {"data/planted.py": "from asyncppo.models import tokenizer\n"},
        [
            "data/planted.py:1: data (layer 0, tier 2) imports asyncppo.models (tier 2); inside a layer imports go to "
            "a lower tier"
        ],
    ),
    "module cycle": (
        {
            "algorithms/planted.py": "from asyncppo.algorithms.gae import gae_recursion\n",
            "algorithms/gae.py": "from asyncppo.algorithms import planted\n",
        },
        ["import cycle: algorithms/gae.py:1 -> algorithms/planted.py:1 -> algorithms/gae.py"],
    ),
    "module cycle through TYPE_CHECKING and a function": (
        {
            "algorithms/planted.py": "def late():\n    from asyncppo.algorithms import gae\n",
            "algorithms/gae.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .planted import late\n",
        },
        ["import cycle: algorithms/gae.py:3 -> algorithms/planted.py:2 -> algorithms/gae.py"],
    ),
}


@pytest.mark.parametrize(("planted", "expected"), PLANTED.values(), ids=PLANTED.keys())
def test_the_checker_reports_each_form_planted_in_a_copy_of_the_tree(tmp_path, planted, expected):
    package = tmp_path / "asyncppo"
    shutil.copytree(SRC, package, ignore=shutil.ignore_patterns("__pycache__"))
    for relative, lines in planted.items():
        path = package / relative
        path.write_text(lines + (path.read_text() if path.exists() else ""))
    assert check_imports(package) == expected


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


def test_the_cycle_finder_names_the_shortest_cycle_with_its_lines(tmp_path):
    package = tmp_path / "asyncppo"
    (package / "pipeline").mkdir(parents=True)
    # a -> b -> c -> a and a -> c -> a: one set of modules, reported once by its shortest cycle through a.
    (package / "pipeline" / "a.py").write_text("from . import b\nfrom asyncppo.pipeline.c import run\n")
    (package / "pipeline" / "b.py").write_text("import asyncppo.pipeline.c\n")
    (package / "pipeline" / "c.py").write_text("x = 1\nfrom asyncppo.pipeline import a\n")
    (package / "pipeline" / "d.py").write_text("from asyncppo.pipeline import a\n")  # imports the cycle, not in it
    assert find_import_cycles(package) == ["import cycle: pipeline/a.py:2 -> pipeline/c.py:2 -> pipeline/a.py"]
