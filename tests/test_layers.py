"""The package's layers import downward only, and no module imports itself through others.

Every import counts: top-level ones, those inside functions and those under ``TYPE_CHECKING``,
since each of them ties the two modules together for a reader and for a refactoring.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "lmctl"

#: Highest first. A module may import modules of its own layer or of a lower one.
LAYERS: list[tuple[str, ...]] = [
    ("lmctl.__main__",),
    ("lmctl.cli",),
    (
        "lmctl.engine",
        "lmctl.evaluation",
        "lmctl.inspection",
        "lmctl.prediction",
        "lmctl.publish",
        "lmctl.mirror",
        "lmctl.pipeline",
    ),
    ("lmctl.objectives", "lmctl.run"),
    ("lmctl.data", "lmctl.models"),
    ("lmctl.fastpaths",),
    ("lmctl.config",),
    ("lmctl.storage",),
    (
        "lmctl.errors",
        "lmctl.console",
        "lmctl.metrics",
        "lmctl.distributed",
        "lmctl.resources",
        "lmctl.secrets",
        "lmctl.environment",
        "lmctl",
    ),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The lmctl modules that ``path`` imports anywhere in its body."""
    found: set[str] = set()
    package = module_name(path) if path.name == "__init__.py" else module_name(path.parent)
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(candidate if candidate in known else base)
    return {name for name in found if name in known}


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(path, known) - {name} for name, path in mods.items()}


def layer_of(module: str) -> int:
    best: tuple[int, int] | None = None  # (prefix length, layer index): the longest prefix wins
    for index, members in enumerate(LAYERS):
        for prefix in members:
            within = module == prefix or (prefix != "lmctl" and module.startswith(prefix + "."))
            if within and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    if best is None:
        raise AssertionError(f"{module} belongs to no layer: add it to LAYERS in {__file__}")
    return best[1]


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import circle as a chain ``a -> b -> ... -> a``, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def upward_imports(edges: dict[str, set[str]]) -> list[str]:
    return [
        f"{source} (layer {layer_of(source)}) -> {target} (layer {layer_of(target)})"
        for source, targets in sorted(edges.items())
        for target in sorted(targets)
        if layer_of(target) < layer_of(source)
    ]


def test_every_module_has_a_layer() -> None:
    for module in modules():
        layer_of(module)


def test_no_import_circle() -> None:
    cycle = find_cycle(graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_layers_import_downward_only() -> None:
    climbing = upward_imports(graph())
    assert not climbing, "imports that climb the layers:\n  " + "\n  ".join(climbing)


def test_every_package_says_what_lives_there() -> None:
    for folder in sorted(p for p in PACKAGE.iterdir() if p.is_dir() and any(p.glob("*.py"))):
        assert (folder / "__init__.py").is_file(), f"{folder.name}/ has no __init__.py"
    for init in sorted(PACKAGE.rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        assert doc, f"{init.relative_to(PACKAGE.parent)} has no docstring"


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"lmctl.storage.paths": {"lmctl.config.base"}}, "upward"),
        ({"lmctl.errors": {"lmctl.console"}, "lmctl.console": {"lmctl.errors"}}, "circle"),
    ],
)
def test_the_checks_catch_a_bad_import(extra: dict[str, set[str]], expected: str) -> None:
    edges = graph()
    for source, targets in extra.items():
        edges[source] = edges.get(source, set()) | targets
    if expected == "upward":
        assert any("lmctl.storage.paths" in line for line in upward_imports(edges))
    else:
        assert find_cycle(edges) is not None


#: The document classes: ``TrainConfig`` and the objectives' subclasses of it.
DOCUMENT_CLASSES = frozenset(
    {
        "TrainConfig",
        "SequenceConfig",
        "LineByLineConfig",
        "ClmConfig",
        "MlmConfig",
        "PlmConfig",
        "SwagConfig",
    }
)
#: Where the document may be a parameter: the layers that build and validate it, the entry
#: points of training and evaluation that slice it, and the writer of ``lmctl.yaml``.
DOCUMENT_READERS = ("lmctl.config", "lmctl.cli")
SLICING_FUNCTIONS = frozenset(
    {
        ("lmctl.engine", "train"),
        ("lmctl.inspection.report", "inspect_data"),
        ("lmctl.run.rundir", "write_config"),
    }
)


def _names_in(annotation: ast.expr | None) -> set[str]:
    if annotation is None:
        return set()
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        annotation = ast.parse(annotation.value, mode="eval").body
    return {node.id for node in ast.walk(annotation) if isinstance(node, ast.Name)} | {
        node.attr for node in ast.walk(annotation) if isinstance(node, ast.Attribute)
    }


def document_parameters() -> list[str]:
    """Functions outside the document's readers that take the document as a parameter."""
    found = []
    for module, path in modules().items():
        if module.startswith(DOCUMENT_READERS):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if (module, node.name) in SLICING_FUNCTIONS:
                continue
            arguments = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            for argument in arguments:
                if _names_in(argument.annotation) & DOCUMENT_CLASSES:
                    found.append(f"{module}.{node.name}({argument.arg})")
    return found


def test_only_the_entry_points_take_the_whole_config() -> None:
    taking = document_parameters()
    assert not taking, "functions given the whole TrainConfig, not its slices:\n  " + "\n  ".join(
        taking
    )


def test_every_config_field_belongs_to_one_slice() -> None:
    from lmctl.config.base import TrainConfig
    from lmctl.config.slices import DOCUMENT_ONLY, SHARED_SLICES, field_names
    from lmctl.objectives import OBJECTIVES, get_objective

    shared = [name for kind in SHARED_SLICES.values() for name in field_names(kind)]
    assert len(shared) == len(set(shared)), "a field in two slices"
    assert not set(shared) & set(DOCUMENT_ONLY)
    assert set(shared) | set(DOCUMENT_ONLY) == set(TrainConfig.model_fields)
    for name in OBJECTIVES:
        objective = get_objective(name)
        own = field_names(objective.options_class)
        assert not set(own) & set(shared), f"{name}: an option in a shared slice too"
        assert set(own) | set(shared) | set(DOCUMENT_ONLY) == set(
            objective.config_class.model_fields
        ), f"{name}: its options type and its document differ"


def test_the_document_check_catches_a_whole_config_parameter(tmp_path: Path) -> None:
    source = "def f(config: TrainConfig) -> None: ...\ndef g(options: 'MlmConfig') -> None: ...\n"
    tree = ast.parse(source)
    functions = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    assert all(_names_in(f.args.args[0].annotation) & DOCUMENT_CLASSES for f in functions)


ROOT = PACKAGE.parents[1]
BENCHMARKS = ROOT / "benchmarks"
#: No file of the package or the benchmarks grows past this: a longer one holds a second idea.
MOST_LINES = 600


def benchmark_graph() -> dict[str, set[str]]:
    """The benchmarks' modules and those of them each imports (anywhere in its body)."""
    names = {path.stem for path in BENCHMARKS.glob("*.py")}
    edges: dict[str, set[str]] = {}
    for path in BENCHMARKS.glob("*.py"):
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                parts = node.module.split(".")
                if parts[0] == "benchmarks":
                    found.update(
                        [parts[1]] if len(parts) > 1 else [alias.name for alias in node.names]
                    )
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    if parts[0] == "benchmarks" and len(parts) > 1:
                        found.add(parts[1])
        edges[path.stem] = (found & names) - {path.stem}
    return edges


def test_no_import_circle_in_the_benchmarks() -> None:
    cycle = find_cycle(benchmark_graph())
    assert cycle is None, "import circle in benchmarks/: " + " -> ".join(cycle or [])


def test_no_file_holds_two_ideas() -> None:
    files = [*PACKAGE.rglob("*.py"), *BENCHMARKS.glob("*.py")]
    long = {
        str(path.relative_to(ROOT)): count
        for path in files
        if (count := len(path.read_text(encoding="utf-8").splitlines())) > MOST_LINES
    }
    assert not long, f"files over {MOST_LINES} lines: {long}"
