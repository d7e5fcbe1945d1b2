"""The package's import structure: ``import tokenmix`` loads almost nothing, each public name brings
only what it needs, and no module imports one that (directly or not) imports it back."""

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


def loaded_after(code: str) -> list[str]:
    """The tokenmix modules a fresh interpreter holds after running ``code``."""
    script = f"import sys\n{code}\nimport json\nprint(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'tokenmix')))"
    return json.loads(subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True).stdout)


def test_import_tokenmix_loads_no_model_data_or_training_code():
    assert loaded_after("import tokenmix") == ["tokenmix", "tokenmix.lazy", "tokenmix.version"]


def test_building_and_running_a_model_loads_no_application_code():
    build_and_run = "tokenmix.build_model('tnn', vocab_size=8, dim=8, depth=1)(torch.zeros(1, 4, dtype=torch.long))"
    modules = loaded_after(f"import tokenmix, torch\n{build_and_run}")
    assert "tokenmix.models.model" in modules
    assert [m for m in modules if m.startswith(APPLICATION)] == []


@pytest.mark.parametrize("package", [tokenmix, tokenmix.data])
def test_every_public_name_resolves(package):
    for name in package.__all__:
        assert getattr(package, name) is not None, name
    assert set(package.__all__) <= set(dir(package))
    with pytest.raises(AttributeError, match="no_such_name"):
        package.no_such_name  # noqa: B018


def module_imports() -> dict[str, set[str]]:
    """Module -> the tokenmix modules it imports anywhere in its file (top level or inside functions)."""
    files = PACKAGE.rglob("*.py")
    names = {".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): path for path in files}
    graph = {}
    for name, path in names.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]) if node.level else ""
                module = ".".join(part for part in (base, node.module) if part)
                targets |= {f"{module}.{alias.name}" if f"{module}.{alias.name}" in names else module for alias in node.names}
            elif isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
        graph[name] = {target for target in targets if target in names and target != name}
    return graph


def test_no_import_cycle_inside_the_package():
    graph = module_imports()
    assert len(graph) > 50 and graph["tokenmix.runs.weights"] >= {"tokenmix.models.model", "tokenmix.models.config"}
    try:
        list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as error:
        pytest.fail(f"import cycle: {' -> '.join(error.args[1])}")


def test_runs_sits_below_the_application_that_reads_and_writes_runs():
    """``tokenmix.runs`` (a run on disk) imports the library, data and parallel, never the layers above it."""
    above = ("tokenmix.generation", "tokenmix.train", "tokenmix.serve", "tokenmix.bench", "tokenmix.hf", "tokenmix.cli")
    graph = module_imports()
    upward = {
        name: sorted(t for t in targets if t.startswith(above)) for name, targets in graph.items() if name.startswith("tokenmix.runs")
    }
    assert len(upward) >= 8 and not any(upward.values()), upward
