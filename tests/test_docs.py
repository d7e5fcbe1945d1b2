"""The docs name what the code accepts, and cite papers the way a reader can find them."""

import re
import shlex
from dataclasses import replace
from pathlib import Path

import pytest
from locations import ROOT

import tokenmix
from tokenmix.bench.plan import apply_presets, bench_cases, check_cases
from tokenmix.cli import build_parser
from tokenmix.mixers.parts import leaf_names
from tokenmix.mixers.registry import resolve_mixer_options
from tokenmix.models import resolve_model_options

OPTIONS = (ROOT / "docs" / "options.md").read_text()


@pytest.mark.parametrize("name", tokenmix.list_mixers() + tokenmix.list_models())
def test_options_page_names_every_option(name):
    mixer = name in tokenmix.list_mixers()
    resolved = resolve_mixer_options(name, {}, dim=8) if mixer else resolve_model_options(name, {}, dim=8, depth=4)
    missing = [option for option in leaf_names(resolved) if f"`{option.split('.')[-1]}`" not in OPTIONS]
    assert f"`{name}`" in OPTIONS and not missing, f"docs/options.md lacks {name}: {missing}"


def test_docs_cite_papers_by_name_not_by_internal_file():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "tokenmix").rglob("*.py"))]
    internal = re.compile(r"paper 00[0-4]|references\.md|shared/papers|Foundation (demo|issue)|the issue", re.IGNORECASE)
    offending = [
        f"{page.relative_to(ROOT)}: {line.strip()}" for page in pages for line in page.read_text().splitlines() if internal.search(line)
    ]
    assert not offending, "\n".join(offending[:20])


def test_options_page_holds_the_tables_printed_from_the_option_dataclasses():
    """Regenerate with ``python docs/options_page.py docs/options.md``."""
    assert docs_script("options_page").printed_section() in OPTIONS


def test_architecture_page_lists_capabilities_every_mixer_has():
    from tokenmix.mixers import Mixer

    text = (ROOT / "docs" / "architecture.md").read_text()
    listed = re.findall(r"^\| `(\w+)` \|", text, re.MULTILINE)
    assert len(listed) >= 7 and all(hasattr(Mixer, name) for name in listed), listed


def docs_script(path: str):
    """``docs/PATH.py``, loaded from its file (a script of the docs, not a package module)."""
    import importlib.util
    import sys

    name = "docs_" + path.replace("/", "_")
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "docs" / f"{path}.py")
        sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # before it runs: its dataclass looks itself up there
        spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules[name]


def results_pages():
    """``docs/results/regenerate.py``, the script that rewrites the results pages."""
    return docs_script("results/regenerate")


def test_results_pages_show_what_their_data_renders():
    """Every table on docs/results/ is what its command printed from its data file: regenerate with
    ``python docs/results/regenerate.py``, never by editing a page's console blocks."""
    regenerate = results_pages()
    pages = regenerate.pages([])
    assert len(pages) >= 4
    stale = [page.name for page in pages if page.read_text() != regenerate.rendered_page(page.read_text())]
    assert not stale, f"out of date: {stale}"


def test_a_figure_typed_into_a_results_page_is_rewritten_from_its_data():
    regenerate = results_pages()
    page = (ROOT / "docs" / "results" / "demo.md").read_text()
    edited = re.sub(r"(\|\s+test \|\s+512 \| )(\d)", lambda match: match.group(1) + str((int(match.group(2)) + 1) % 10), page, count=1)
    assert edited != page
    assert regenerate.rendered_page(edited) == page


def test_every_file_under_docs_results_is_shown_by_a_page():
    """Data and figures nothing links to are left over from a measurement no page shows any more."""
    pages = "".join(page.read_text() for page in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
    folder = ROOT / "docs" / "results"
    files = [path for kind in ("data", "figures") for path in (folder / kind).rglob("*") if path.is_file()]
    unshown = [name for name in (str(path.relative_to(folder)) for path in files) if name not in pages]
    assert files and not unshown, unshown


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lowercase, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def test_links_between_pages_reach_a_file_and_a_heading():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # a web address
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists() or (anchor and linked.suffix == ".md" and anchor not in anchors(linked)):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken


def gpu_checks_script() -> str:
    """docs/results/gpu_checks.sh with its continued lines joined."""
    return (ROOT / "docs" / "results" / "gpu_checks.sh").read_text().replace("\\\n", " ")


def gpu_checks_bench_commands() -> list[list[str]]:
    """The ``tokenmix bench`` argument lists of docs/results/gpu_checks.sh, its ``bench NAME ARGS...`` lines with the
    helper's own arguments put in and the loop's ``$kernels`` taken each way."""
    script = gpu_checks_script()
    helper = re.search(r'^bench\(\) \{ step "\$1" "\$python" -m tokenmix\.cli bench (.*) "\$\{@:2\}"; \}$', script, re.MULTILINE)
    loop = re.search(r"^for kernels in ([\w ]+); do$", script, re.MULTILINE)
    assert helper and loop, "gpu_checks.sh: its bench() helper or its loop over kernels changed: update this test"
    commands = []
    for line in re.findall(r"^\s*bench (.*)$", script, re.MULTILINE):
        for kernels in loop.group(1).split() if "$kernels" in line else [None]:
            words = shlex.split(line.replace('"$kernels"', kernels or ""))
            commands.append(["bench", *shlex.split(helper.group(1).replace('"$work/$1.json"', f"/tmp/{words[0]}.json")), *words[1:]])
    return commands


@pytest.mark.filterwarnings("ignore:bf16 on this CPU")
def test_the_gpu_checks_script_asks_only_for_what_the_bench_accepts():
    """A lent GPU's minutes are few: every benchmark the script runs there parses, plans its cases and builds and runs
    each once at a tiny length here (``check_cases``, on the CPU and with PyTorch's products)."""
    commands = gpu_checks_bench_commands()
    assert len(commands) == 7
    for command in commands:
        args = build_parser().parse_args(command)
        apply_presets(args)
        cases = bench_cases(args)
        assert cases and {case.device for case in cases} == {"cuda"}, command
        check_cases([replace(case, device="cpu", kernels="torch") for case in cases])


def test_every_test_the_gpu_checks_script_selects_exists():
    """Each word of the script's ``-k`` expression names a test in the files it runs: a renamed test is not silently
    left out of the only run that has a GPU."""
    script = gpu_checks_script()
    run = re.search(r'^(?:\S+=\S+ )?step tests "\$python" -m pytest (.*)$', script, re.MULTILINE)
    assert run, "gpu_checks.sh: its pytest step changed: update this test"
    words = shlex.split(run.group(1))
    files = [word for word in words if word.startswith("tests/")]
    names = re.findall(r"^def (test_\w+)", "".join((ROOT / file).read_text() for file in files), re.MULTILINE)
    selected = words[words.index("-k") + 1].split(" or ")
    assert files and [word for word in selected if not any(word in name for name in names)] == []
