"""The package's structure: ``import tokenmix`` loads almost nothing, each public name brings only what it
needs, no module imports one that (directly or not) imports it back, imports go only down the layers of
packages, and every class and function is short enough to read."""

import ast
import graphlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import tokenmix
import tokenmix.data

PACKAGE = Path(tokenmix.__file__).parent
APPLICATION = (
    "tokenmix.data.",
    "tokenmix.runs",
    "tokenmix.train.",
    "tokenmix.bench.",
    "tokenmix.hf.",
    "tokenmix.generation.",
    "tokenmix.cli",
)


def loaded_after(code: str, roots: tuple[str, ...] = ("tokenmix",)) -> list[str]:
    """The modules of ``roots`` (top-level names, or a package such as "torch._dynamo") a fresh interpreter holds after
    running ``code``."""
    wanted = f"m == r or m.startswith(r + '.') for r in {roots!r}"
    script = f"import sys\n{code}\nimport json\nprint(json.dumps(sorted(m for m in sys.modules if any({wanted}))))"
    return json.loads(subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True).stdout)


def test_import_tokenmix_loads_no_model_data_or_training_code():
    assert loaded_after("import tokenmix") == ["tokenmix", "tokenmix.lazy", "tokenmix.version"]


def test_building_and_running_a_model_loads_no_application_code():
    build_and_run = "tokenmix.build_model('tnn', vocab_size=8, dim=8, depth=1)(torch.zeros(1, 4, dtype=torch.long))"
    modules = loaded_after(f"import tokenmix, torch\n{build_and_run}", roots=("tokenmix", "torch._dynamo", "triton"))
    assert "tokenmix.models.model" in modules
    assert [m for m in modules if m.startswith(APPLICATION)] == []
    assert [m for m in modules if not m.startswith("tokenmix")] == []  # the compiler, the kernels: on first use only


@pytest.mark.parametrize("package", [tokenmix, tokenmix.data])
def test_every_public_name_resolves(package):
    for name in package.__all__:
        assert getattr(package, name) is not None, name
    assert set(package.__all__) <= set(dir(package))
    with pytest.raises(AttributeError, match="no_such_name"):
        package.no_such_name  # noqa: B018


def module_imports() -> dict[str, set[str]]:
    """Module -> the tokenmix modules it imports anywhere in its file (top level or inside functions), and
    those its ``lazy_exports`` table names (imported on first use)."""
    files = PACKAGE.rglob("*.py")
    names = {".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): path for path in files}
    graph = {}
    for name, path in names.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                module = absolute_name(package, node.level, node.module)
                targets |= {f"{module}.{alias.name}" if f"{module}.{alias.name}" in names else module for alias in node.names}
            elif isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
        for relative in lazy_export_modules(tree):
            module = relative.lstrip(".")
            targets.add(absolute_name(package, len(relative) - len(module), module))
        graph[name] = {target for target in targets if target in names and target != name}
    return graph


def absolute_name(package: str, level: int, module: str | None) -> str:
    """The absolute name of ``from {"." * level}{module} import ...`` written in ``package``."""
    parts = package.split(".")
    return ".".join(part for part in (".".join(parts[: len(parts) - level + 1]) if level else "", module) if part)


def lazy_export_modules(tree: ast.Module) -> list[str]:
    """The relative module names (``".models"``) of the table a module passes to ``lazy_exports``."""
    tables = {
        target.id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    modules = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "lazy_exports":
            table = node.args[1]
            table = tables.get(table.id) if isinstance(table, ast.Name) else table
            modules += [value.value for value in table.values]
    return modules


def test_no_import_cycle_inside_the_package():
    graph = module_imports()
    assert len(graph) > 50 and graph["tokenmix.runs.weights"] >= {"tokenmix.models.model", "tokenmix.models.config"}
    try:
        list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as error:
        pytest.fail(f"import cycle: {' -> '.join(error.args[1])}")


# The packages from the bottom up (docs/architecture.md): a module imports only from its own package and those
# before it. The top-level modules (errors.py, state.py, options.py, ...) sit below every package.
LAYERS = ("io", "ops", "mixers", "blocks", "models", "data", "parallel", "runs", "generation", "train", "serve", "bench", "hf", "cli")


def layer(module: str) -> int:
    """The position of ``module``'s layer: 0 for the top-level modules, then LAYERS in order, the ``tokenmix`` facade last."""
    parts = module.split(".")
    if len(parts) == 1:
        return len(LAYERS) + 1  # tokenmix/__init__.py: the public names, each imported on first use
    if not (PACKAGE / parts[1]).is_dir():
        return 0
    assert parts[1] in LAYERS, f"the package tokenmix.{parts[1]} is not in LAYERS: give it its place in the order"
    return LAYERS.index(parts[1]) + 1


def package_of(module: str) -> str:
    """``tokenmix.P`` for a module of package P, the module itself for a top-level module."""
    return ".".join(module.split(".")[:2])


def test_every_package_has_its_place_in_the_layer_order():
    packages = sorted(path.name for path in PACKAGE.iterdir() if (path / "__init__.py").is_file())
    assert len(packages) >= 10 and set(packages) <= set(LAYERS), sorted(set(packages) - set(LAYERS))


def test_no_import_points_up_the_layer_order():
    upward = [
        f"{module} -> {target}"
        for module, targets in sorted(module_imports().items())
        for target in sorted(targets)
        if layer(target) > layer(module)
    ]
    assert not upward, "imports pointing up the layers " + " < ".join(LAYERS) + ":\n" + "\n".join(upward)


def test_no_import_cycle_between_packages():
    graph = {}
    for module, targets in module_imports().items():
        graph.setdefault(package_of(module), set()).update(
            package_of(target) for target in targets if package_of(target) != package_of(module)
        )
    assert graph["tokenmix.cli"] >= {"tokenmix.train", "tokenmix.bench"}
    try:
        list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as error:
        pytest.fail(f"import cycle between packages: {' -> '.join(error.args[1])}")


LONGEST_CLASS, LONGEST_FUNCTION = 250, 80  # lines, from the definition's first line to its last


def definition_lengths() -> dict[str, int]:
    """``"path: name"`` -> lines of every class (``class Name``) and function (``Class.method``, ``outer.inner``) in the
    package; a nested function's lines count toward its parent too."""
    lengths = {}

    def visit(node, path: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                key = f"class {name}" if isinstance(child, ast.ClassDef) else name
                lengths[f"{path}: {key}"] = child.end_lineno - child.lineno + 1
                visit(child, path, f"{name}.")
            else:
                visit(child, path, prefix)

    for file in sorted(PACKAGE.rglob("*.py")):
        visit(ast.parse(file.read_text()), str(file.relative_to(PACKAGE.parent)), "")
    return lengths


def test_every_class_and_function_is_short():
    lengths = definition_lengths()
    assert lengths["tokenmix/cli/__init__.py: main"] > 10 and any(key.endswith(": class Tokenizer") for key in lengths)
    limit = lambda key: LONGEST_CLASS if ": class " in key else LONGEST_FUNCTION  # noqa: E731
    too_long = [f"{key}: {lines} lines (at most {limit(key)})" for key, lines in lengths.items() if lines > limit(key)]
    assert not too_long, "\n".join(too_long)
