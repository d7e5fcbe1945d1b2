"""The docs name what the code accepts, and cite papers the way a reader can find them."""

import re
from pathlib import Path

import pytest

import tokenmix
from tokenmix.mixers.parts import leaf_names
from tokenmix.mixers.registry import resolve_mixer_options
from tokenmix.models import resolve_model_options

ROOT = Path(__file__).resolve().parents[1]
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
    """Regenerate with ``python -m tokenmix.models.options_page docs/options.md``."""
    from tokenmix.models.options_page import printed_section

    assert printed_section() in OPTIONS


def test_architecture_page_lists_capabilities_every_mixer_has():
    from tokenmix.mixers import Mixer

    text = (ROOT / "docs" / "architecture.md").read_text()
    listed = re.findall(r"^\| `(\w+)` \|", text, re.MULTILINE)
    assert len(listed) >= 7 and all(hasattr(Mixer, name) for name in listed), listed
