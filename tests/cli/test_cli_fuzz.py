"""Every option of every command, driven with bad values that the argument parsers themselves list.

Each argument's kind (``tokenmix.fields``) says which texts it refuses; every command is run from a
valid invocation with one argument made bad at a time: a refused value, a missing value, an
explicit value given to a switch, a missing required argument. Each must exit with status 2 and
one line that names the argument, without a traceback and without doing the command's work. A new
option is covered as soon as it is added (it must have a kind, or be a switch).
"""

import argparse
import json
import shutil
from pathlib import Path

import pytest
from conftest import TINY_RUN, usage_error
from glue_fixture import write_glue
from locations import FIXTURES

from tokenmix.cli import build_parser
from tokenmix.fields import Kind

COMMANDS = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
BENCH_RECORD = {"kind": "mixer", "mixer": "tno", "causal": False, "length": 8, "forward_ms": 1.0, "forward_backward_ms": 3.0}
# Valid invocations: (positional arguments, options); {name} stands for a file from the ``inputs`` fixture.
VALID = {
    "prepare": (["{corpus}"], ["--out", "{fresh}", "--workers", "1"]),
    "train": ([], ["--data", "{corpus}", *TINY_RUN, "--steps", "1", "--out", "{fresh}"]),
    "finetune": (["{mlm}"], ["--data", "glue-sst2:{glue}", "--steps", "1", "--out", "{fresh}"]),
    "eval": (["{lm}"], ["--max-tokens", "32"]),
    "generate": (["{lm}"], ["--max-new-tokens", "2"]),
    "plot": (["{lm}"], ["--out", "{fresh}"]),
    "recipes": ([], []),
    "export-hf": (["{lm}", "{fresh}"], []),
    "distil": (["{lm}"], ["--order", "2", "--horizon", "8", "--out", "{fresh}"]),
    "convert-checkpoint": (["{format1}"], ["--trust"]),
    "serve": (["{lm}"], ["--port", "0", "--max-tokens", "8", "--max-prompt-tokens", "8"]),  # each case fails before it listens
    "bench": ([], ["--mixers", "tno", "--kinds", "mixer", "--lengths", "8", "--dim", "8", "--repeats", "1", "--causal", "no"]),
    "compare": (["{bench}", "{bench}"], []),
}


def _long_flag(action) -> str:
    return max(action.option_strings, key=len)


def _names(action, text: str = "") -> list[str]:
    """What an error about ``action`` may call it: its flag or name, or the bad text or a part of it
    (``wikitext:/no/such/folder`` may be reported as the missing folder of ``wikitext``)."""
    names = [*action.option_strings, action.dest, action.dest.replace("_", "-")]
    return names + [part for part in (text, *text.split(":")) if len(part) > 1]


def bad_invocations() -> list[tuple[str, str, list[str], list[str], list[str]]]:
    """(command, id, positionals, options, names) with one argument made bad, and what the error may call it."""
    cases = []
    for command, parser in COMMANDS.items():
        positionals, options = VALID[command]
        slots = [action for action in parser._actions if not action.option_strings]
        for index, action in enumerate(slots):
            for text in action.type.invalid():
                changed = [*positionals[:index], text, *positionals[index + 1 :]]
                cases.append((command, f"{action.dest}={text!r}", changed, options, _names(action, text)))
        required = [action for action in slots if action.nargs not in ("?", "*")]
        if required:
            cases.append((command, "missing positional", [], options, _names(required[0])))
        for action in parser._actions:
            if not action.option_strings or isinstance(action, argparse._HelpAction):
                continue
            flag = _long_flag(action)
            if action.nargs == 0:
                cases.append((command, f"{flag}=x", positionals, [*options, f"{flag}=x"], _names(action)))
                continue
            if action.nargs != "?":  # a flag whose value is optional (--resume [auto]) is complete alone
                cases.append((command, f"{flag} (no value)", positionals, [*options, flag], _names(action)))
            for text in action.type.invalid():
                cases.append((command, f"{flag} {text!r}", positionals, [*options, flag, text], _names(action, text)))
        for group in parser._mutually_exclusive_groups:
            flags = [_long_flag(action) for action in group._group_actions]
            cases.append((command, " and ".join(flags), positionals, [*options, *flags], flags))
    return cases


CASES = bad_invocations()


def test_every_argument_has_a_kind_that_lists_bad_values():
    for command, parser in COMMANDS.items():
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction) or action.nargs == 0:
                continue
            assert isinstance(action.type, Kind), f"tokenmix {command} {action.option_strings or action.dest} has no kind"
            assert action.type.invalid(), f"tokenmix {command} {action.dest}: its kind lists no bad value"
    assert len(CASES) >= 300, len(CASES)


@pytest.fixture(scope="module")
def inputs(tiny_runs, tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("fuzz")
    (root / "corpus.txt").write_bytes(b"To be, or not to be, that is the question. " * 200)
    (root / "bench.json").write_text(json.dumps([BENCH_RECORD]))
    format1 = root / "format1" / "checkpoint.pt"
    format1.parent.mkdir()
    shutil.copy(FIXTURES / "format1_transformer_xl.pt", format1)
    glue = write_glue(root / "glue", train=40, dev=10)
    return {"corpus": root / "corpus.txt", "bench": root / "bench.json", "format1": format1, "glue": glue, **tiny_runs}


@pytest.mark.parametrize(("command", "case", "positionals", "options", "names"), CASES, ids=[f"{c[0]} {c[1]}" for c in CASES])
def test_a_bad_argument_is_one_line_that_names_it_and_no_work(inputs, tmp_path, capsys, command, case, positionals, options, names):
    fresh = tmp_path / "fresh"
    arguments = [part.format(**inputs, fresh=fresh) for part in [command, *positionals, *options]]
    original = Path(inputs["format1"]).read_bytes()
    error = usage_error(arguments, capsys)  # exit status 2, one line, no traceback
    assert not fresh.exists(), "a refused command left output behind"
    assert Path(inputs["format1"]).read_bytes() == original
    assert error.startswith(f"tokenmix {command}: error: ") and any(name in error for name in names), error
