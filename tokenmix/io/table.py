"""Plain-text tables for the CLI (also valid Markdown)."""

from __future__ import annotations


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:.0f}"
    return str(value)


def format_table(rows: list[dict], columns: list[str]) -> str:
    """Render ``rows`` (dicts) as a Markdown table of ``columns``, right-aligned."""
    cells = [[_cell(row.get(column)) for column in columns] for row in rows]
    widths = [max(len(column), *(len(line[i]) for line in cells)) for i, column in enumerate(columns)]
    lines = ["| " + " | ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True)) + " |"]
    lines.append("|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|")
    lines += ["| " + " | ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) + " |" for line in cells]
    return "\n".join(lines)
