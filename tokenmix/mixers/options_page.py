"""The mixers' option tables of docs/options.md, printed from each mixer's options dataclass.

    python -m tokenmix.mixers.options_page docs/options.md

rewrites the part of the page between ``BEGIN`` and ``END``; ``tests/test_docs.py`` checks that the
page holds what this prints, so a table cannot fall behind the code.
"""

from __future__ import annotations

import json
import sys
from dataclasses import MISSING, fields
from pathlib import Path

from .registry import list_mixers, mixer_class

BEGIN = "<!-- mixer options: printed by `python -m tokenmix.mixers.options_page docs/options.md` -->"
END = "<!-- end of the printed mixer options -->"


def mixer_table(name: str) -> str:
    """A heading, the mixer's summary and one row per option: name, accepted values, default, meaning."""
    cls = mixer_class(name)
    summary = (cls.__doc__ or "").strip().splitlines()[0]
    causal = {(False,): "Bidirectional only.", (True,): "Causal only."}.get(tuple(cls.causal_modes), "Causal or bidirectional.")
    heading = [f"### `{name}`", "", f"{summary.replace('``', '`')} {causal}", ""]
    lines = [*heading, "| option | values | default | meaning |", "| --- | --- | --- | --- |"]
    for spec in fields(cls.options_type):
        kind = spec.metadata["kind"]
        values = kind.describe() + (" or null" if kind.optional else "")
        default = spec.default_factory() if spec.default is MISSING else spec.default
        lines.append(f"| `{spec.name}` | {values} | `{json.dumps(default)}` | {spec.metadata['help']} |")
    if not fields(cls.options_type):
        lines.append("| (none) | | | |")
    return "\n".join(lines)


def mixer_section() -> str:
    """Every registered mixer's table, between the markers."""
    return "\n\n".join([BEGIN, *(mixer_table(name) for name in list_mixers()), END])


def rewrite(page: Path) -> None:
    """Replace the part of ``page`` between the markers by ``mixer_section()``."""
    text = page.read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"{page} lacks the markers {BEGIN!r} and {END!r}")
    before, rest = text.split(BEGIN, 1)
    after = rest.split(END, 1)[1]
    page.write_text(before + mixer_section() + after)


if __name__ == "__main__":
    rewrite(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/options.md"))
