"""Regenerate the results pages under docs/results/ from the project's own tools.

Each page is Markdown whose figures sit in ``console`` blocks: the commands, each on a line that
starts with ``$ `` (a trailing backslash continues it), and below each the output the tool prints
for it, rendered from the file the command wrote: ``tokenmix eval --json FILE`` its table, ``tokenmix
distil --json FILE`` its report, ``tokenmix bench --output FILE`` its tables, ``tokenmix compare
BEFORE AFTER`` its speed-ups.
Anything else a block shows is rewritten; the prose around the blocks is left alone. Each page
ends with the data files it reads and the commit each was measured at.

    python docs/results/regenerate.py                 # rewrite every page from its data (seconds)
    python docs/results/regenerate.py --check         # exit 1 if a page differs from its data
    python docs/results/regenerate.py --list [PAGE]   # the commands, in order
    python docs/results/regenerate.py --run PAGE ...  # run the commands, then rewrite the pages
    python docs/results/regenerate.py --run speed --section "Keeping freed memory"   # one section's

``--run`` executes every command of the named pages (a stem such as ``recall``, or ``all``) in
order, in a work directory (``--workdir``, default ``runs/results``) where ``docs`` and ``tests``
link to this checkout's: the runs the commands train land in the work directory, the data they
write in docs/results/data/. A command that finished in the work directory before is not run
again, so an interrupted ``--run`` continues where it stopped and a run two pages use is trained
once; a fresh measurement needs a fresh work directory.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

from tokenmix.bench.compare import comparison_table
from tokenmix.bench.run import bench_tables
from tokenmix.cli.distil import distil_report
from tokenmix.cli.evaluate import eval_report
from tokenmix.io.files import write_text_atomic

PAGES = Path(__file__).resolve().parent
ROOT = PAGES.parents[1]
BLOCK = re.compile(r"^```console\n(.*?)^```$", re.MULTILINE | re.DOTALL)
SOURCES_HEADING = "## Data on this page"
COMPLETED = "completed-commands"  # in a --run work directory: the commands that finished there, NUL-separated


@dataclass
class Command:
    text: str  # as shown, continuation lines included

    @property
    def argv(self) -> list[str]:
        """The tool's words: without a leading ``time`` or ``NAME=value`` environment settings, and
        ``torchrun ... -m tokenmix.cli ARGS`` read as ``tokenmix ARGS``."""
        words = shlex.split(self.text.replace("\\\n", " "))
        while words and (words[0] == "time" or re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0])):
            words = words[1:]
        if words[:1] == ["torchrun"] and "tokenmix.cli" in words:
            words = ["tokenmix", *words[words.index("tokenmix.cli") + 1 :]]
        return words

    def option(self, name: str) -> str | None:
        argv = self.argv
        return argv[argv.index(name) + 1] if name in argv[:-1] else None

    def data_files(self) -> list[str]:
        """The files whose content this command's output is rendered from."""
        argv = self.argv
        if argv[:2] in (["tokenmix", "eval"], ["tokenmix", "distil"]) and self.option("--json"):
            return [self.option("--json")]
        if argv[:2] == ["tokenmix", "bench"] and self.option("--output"):
            return [self.option("--output")]
        if argv[:2] == ["tokenmix", "compare"]:
            return argv[2:4]
        return []

    def rendered_output(self) -> str:
        """What the tool prints for this command, recomputed from the files it wrote or reads."""
        argv, files = self.argv, [ROOT / path for path in self.data_files()]
        if not files:
            return ""
        missing = [str(path.relative_to(ROOT)) for path in files if not path.is_file()]
        if missing:
            raise SystemExit(f"regenerate.py: {', '.join(missing)} not found: run the page's commands (--run PAGE)")
        if argv[1] == "eval":
            results = json.loads(files[0].read_text())
            return eval_report([current_eval_result(result) for result in (results if isinstance(results, list) else [results])])
        if argv[1] == "distil":
            return distil_report(json.loads(files[0].read_text()))
        if argv[1] == "bench":
            return bench_tables(json.loads(files[0].read_text()))
        with warnings.catch_warnings():  # a condition that differs between the files is the page's to say
            warnings.simplefilter("ignore")
            return comparison_table(*map(str, files))


def current_eval_result(result: dict) -> dict:
    """An eval record as today's ``tokenmix eval`` writes it. Records from before tokenizers name
    bits per byte ``bpc`` (the same number for byte tokens) and have one split and no tokenizer."""
    if "splits" in result:  # records from before eval named a run's tokenizer and training cost
        return {"tokenizer": None, "training": {}, **result}
    rows = [
        {"split": result["split"], **{("bpb" if key == "bpc" else key): value for key, value in row.items()}} for row in result["results"]
    ]
    return {**result, "splits": [result["split"]], "tokenizer": None, "results": rows, "training": result.get("training", {})}


def commands_of(block: str) -> list[Command]:
    commands, lines = [], block.splitlines()
    for number, line in enumerate(lines):
        if line.startswith("$ ") and (number == 0 or not lines[number - 1].endswith("\\")):
            text = line[2:]
            while text.endswith("\\") and number + 1 < len(lines):
                number += 1
                text += "\n" + lines[number]
            commands.append(Command(text))
    return commands


def rendered_block(block: str) -> str:
    parts = []
    for command in commands_of(block):
        output = command.rendered_output()
        parts.append("$ " + command.text + ("\n" + output if output else ""))
    return "\n".join(parts) + "\n"


def data_files(page: str) -> list[str]:
    files = [path for command in page_commands(page) for path in command.data_files()]
    return list(dict.fromkeys(files))


def sources_section(page: str) -> str:
    """Each data file of the page with the commits its records name."""
    rows = []
    for path in data_files(page):
        records = json.loads((ROOT / path).read_text())
        records = records if isinstance(records, list) else [records]
        commits = sorted({str(record.get("git_commit")) for record in records if record.get("git_commit")})
        link = (ROOT / path).relative_to(PAGES)
        rows.append(f"| [{link}]({link}) | {', '.join(commits) or '-'} |")
    if not rows:
        return ""
    table = "\n".join(["| file | measured at commit |", "|---|---|", *rows])
    return f"{SOURCES_HEADING}\n\nPrinted by `python docs/results/regenerate.py` from these files.\n\n{table}\n"


def rendered_page(page: str) -> str:
    body = page.split(SOURCES_HEADING)[0].rstrip() + "\n"
    body = BLOCK.sub(lambda match: "```console\n" + rendered_block(match.group(1)) + "```", body)
    sources = sources_section(body)
    return body + ("\n" + sources if sources else "")


def pages(names: list[str]) -> list[Path]:
    every = sorted(path for path in PAGES.glob("*.md") if path.name != "README.md")
    if not names or names == ["all"]:
        return every
    unknown = sorted(set(names) - {path.stem for path in every})
    if unknown:
        raise SystemExit(f"regenerate.py: no page {unknown}; the pages are {[path.stem for path in every]} (or all)")
    return [path for path in every if path.stem in names]


def page_commands(page: str, section: str | None = None) -> list[Command]:
    """The commands of a page's blocks, in order; with ``section``, only those under the heading of that title."""
    commands, heading = [], None
    for part in re.split(r"(^#+ [^\n]*$|^```console\n.*?^```$)", page, flags=re.MULTILINE | re.DOTALL):
        if part.startswith("#"):
            heading = part.lstrip("#").strip()
        elif part.startswith("```console") and section in (None, heading):
            commands += commands_of(BLOCK.match(part).group(1))
    return commands


def run(paths: list[Path], workdir: Path, section: str | None = None) -> None:
    """Each page's commands in order, in ``workdir``; those listed in its ``COMPLETED`` file ran there before."""
    workdir.mkdir(parents=True, exist_ok=True)
    for name in ("docs", "tests"):  # the data files and the fixture scripts the commands name
        if not (workdir / name).exists():
            (workdir / name).symlink_to(ROOT / name)
    completed_file = workdir / COMPLETED
    completed = set(completed_file.read_text().split("\0")) if completed_file.exists() else set()
    for path in paths:
        commands = page_commands(path.read_text(), section)
        if section and not commands:
            raise SystemExit(f"regenerate.py: {path.name} has no commands under a heading {section!r}")
        for number, command in enumerate(commands, 1):
            label = f"[{path.stem} {number}/{len(commands)}]"
            if command.text in completed:
                print(f"{label} ran before in {workdir}: $ {command.text}", flush=True)
                continue
            print(f"{label} $ {command.text}", flush=True)
            subprocess.run(["bash", "-c", command.text], cwd=workdir, check=True)
            completed.add(command.text)
            with completed_file.open("a") as log:
                log.write(command.text + "\0")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pages", nargs="*", help="page stems (default: every page)")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--check", action="store_true", help="report the pages that differ from their data; change nothing")
    action.add_argument("--list", action="store_true", help="print the pages' commands")
    action.add_argument("--run", action="store_true", help="run the pages' commands before rewriting them")
    parser.add_argument("--section", help="with --run or --list: only the commands under the heading of this title")
    parser.add_argument("--workdir", type=Path, default=ROOT / "runs" / "results", help="where --run trains (default runs/results)")
    args = parser.parse_args()
    paths = pages(args.pages)
    if args.list:
        for path in paths:
            print("\n".join(f"$ {command.text}" for command in page_commands(path.read_text(), args.section)))
        return 0
    if args.run:
        run(paths, args.workdir, args.section)
    stale = []
    for path in paths:
        page, rendered = path.read_text(), rendered_page(path.read_text())
        if page != rendered:
            stale.append(path.name)
            if not args.check:
                write_text_atomic(path, rendered)
    if args.check and stale:
        print(f"out of date: {', '.join(stale)} (run python docs/results/regenerate.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
