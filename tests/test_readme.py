from locations import ROOT


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    command = next(line for line in ci_lines if line.startswith("python3 -m venv"))
    assert command in readme


def test_readme_is_short_and_sends_the_detail_to_docs():
    """The README is the overview (at most 200 lines); detail lives in the docs pages it links to."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move detail into a docs/ page it links to"
