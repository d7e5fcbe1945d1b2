"""``tokenmix`` command line: prepare, train, finetune, eval, generate, distil, serve, plot, recipes, export-hf, bench, compare.

Each command reads and checks its input (arguments, data, checkpoints) inside ``user_input()``:
a problem there is reported in one line (exit status 2). Errors after that are bugs and keep
their traceback. A failing machine (a full disk, a peer that died: ``MachineFault``) is one line and
exit status 1. Ctrl-C during training saves a checkpoint and exits with status 130. One module
per command, each with ``add_parser(subparsers)`` and its ``run_*`` handler (``bench``'s many arguments in
``bench_arguments``); the work itself lives in the packages below.
"""

from __future__ import annotations

import argparse
import sys
import warnings

from ..errors import MachineFault, UsageError
from ..mixers.registry import list_mixers
from ..models.registry import list_models
from ..runtime import retain_freed_memory
from ..version import __version__
from . import bench, compare, convert_checkpoint, distil, evaluate, export_hf, finetune, generate, plot, prepare, recipes, serve, train
from .arguments import Parser
from .common import INTERRUPTED_STATUS

# in the order --help lists them
COMMANDS = (prepare, train, finetune, evaluate, generate, distil, serve, plot, recipes, export_hf, convert_checkpoint, bench, compare)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="tokenmix",
        description="Fast token mixers for long sequences: train, evaluate, generate, plot, benchmark.",
        epilog=f"models: {', '.join(list_models())}. mixers: {', '.join(list_mixers())}. `tokenmix COMMAND --help` for each command.",
    )
    parser.add_argument("--version", action="version", version=f"tokenmix {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    retain_freed_memory()
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    args.argv = argv
    try:
        with warnings.catch_warnings():  # a warning is one line, as errors are
            warnings.showwarning = lambda message, *_: print(f"tokenmix {args.command}: warning: {message}", file=sys.stderr)
            return args.handler(args)
    except UsageError as error:
        parser.exit(2, f"tokenmix {args.command}: error: {error}\n")
    except MachineFault as fault:
        parser.exit(1, f"tokenmix {args.command}: {fault}\n")
    except KeyboardInterrupt:
        parser.exit(INTERRUPTED_STATUS, f"tokenmix {args.command}: interrupted\n")
