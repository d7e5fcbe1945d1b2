"""The option tables of docs/options.md, printed from each mixer's and block's options dataclass.

    python docs/options_page.py docs/options.md

rewrites the part of the page between ``BEGIN`` and ``END``; ``tests/test_docs.py`` checks that the
page holds what this prints, so a table cannot fall behind the code.
"""

from __future__ import annotations

import json
import sys
from dataclasses import MISSING
from pathlib import Path

from tokenmix.fields import setting_fields
from tokenmix.mixers.registry import list_mixers, mixer_class
from tokenmix.models.registry import list_models, model_spec

BEGIN = "<!-- option tables: printed by `python docs/options_page.py docs/options.md` -->"
END = "<!-- end of the printed option tables -->"


def option_rows(owner, part_defaults: dict) -> list[str]:
    """A table of ``owner``'s own options (its ``options_type``) and its parts (the mixers it builds)."""
    rows = ["| option | values | default | meaning |", "| --- | --- | --- | --- |"]
    for spec in setting_fields(owner.options_type):
        kind = spec.metadata["kind"]
        values = kind.describe() + (" or null" if kind.optional else "")
        default = spec.default_factory() if spec.default is MISSING else spec.default
        rows.append(f"| `{spec.name}` | {values} | `{json.dumps(default)}` | {spec.metadata['help']} |")
    for part in owner.parts():
        values = f"one of {', '.join(part.allowed())}" if part.choices else "fixed"
        default = part_defaults.get(part.key, part.default)
        rows.append(f"| `{part.key}` | {values} | `{json.dumps(default)}` | a mixer: its options nested under `{part.key}` |")
    return rows if len(rows) > 2 else [*rows, "| (none) | | | |"]


def mixer_table(name: str) -> str:
    """A heading, the mixer's summary, its causal modes and one row per option."""
    cls = mixer_class(name)
    summary = (cls.__doc__ or "").strip().splitlines()[0]
    causal = {(False,): "Bidirectional only.", (True,): "Causal only."}.get(tuple(cls.causal_modes), "Causal or bidirectional.")
    return "\n".join([f"### `{name}`", "", f"{summary.replace('``', '`')} {causal}", "", *option_rows(cls, {})])


def model_table(name: str) -> str:
    """A heading, the model's description, its tasks and one row per option of its blocks."""
    spec = model_spec(name)
    tasks = f"Tasks: {', '.join(spec.tasks)}."
    return "\n".join([f"### `{name}`", "", f"{spec.description}. {tasks}", "", *option_rows(spec.layers, spec.defaults)])


def printed_section() -> str:
    """Every registered mixer's table, then every model's, between the markers."""
    mixers = [mixer_table(name) for name in list_mixers()]
    models = [model_table(name) for name in list_models()]
    return "\n\n".join([BEGIN, "## Mixers", *mixers, "## Models", *models, END])


def rewrite(page: Path) -> None:
    """Replace the part of ``page`` between the markers by ``printed_section()``."""
    text = page.read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"{page} lacks the markers {BEGIN!r} and {END!r}")
    before, rest = text.split(BEGIN, 1)
    after = rest.split(END, 1)[1]
    page.write_text(before + printed_section() + after)


if __name__ == "__main__":
    rewrite(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/options.md"))
