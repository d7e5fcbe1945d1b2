"""The package version (read by pyproject.toml and recorded in every saved config) and the source revision."""

import subprocess
from pathlib import Path

__version__ = "0.2.0"


def source_revision() -> str | None:
    """The git commit of the tokenmix source in use (``-dirty`` with uncommitted changes but to the measured
    results under docs/results/, which a page's earlier commands rewrite); None outside a checkout."""
    root = Path(__file__).resolve().parents[1]

    def git(*arguments: str) -> str | None:
        try:
            result = subprocess.run(["git", "-C", str(root), *arguments], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return result.stdout.strip() if result.returncode == 0 else None

    if git("rev-parse", "--show-toplevel") != str(root):
        return None
    commit = git("rev-parse", "--short=12", "HEAD")
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)docs/results")
    return commit and commit + ("-dirty" if changed else "")
