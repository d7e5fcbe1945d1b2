"""``tokenmix convert-checkpoint``: an older (pickled) checkpoint in today's code-free format."""

from __future__ import annotations

from ..errors import user_input
from .common import RUN


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "convert-checkpoint",
        help="rewrite a checkpoint of tokenmix 0.2 or earlier (pickled objects) in today's format, which loads without running code",
    )
    parser.add_argument("checkpoint", type=RUN, help="checkpoint.pt or its run directory (the original is kept as checkpoint.pt.format1)")
    parser.add_argument(
        "--trust",
        action="store_true",
        help="you trust where the file came from: converting unpickles it once, and unpickling runs any code a file holds",
    )
    parser.set_defaults(handler=run_convert_checkpoint)


def run_convert_checkpoint(args) -> int:
    from ..runs.legacy import convert_checkpoint

    with user_input():
        if not args.trust:
            raise ValueError(
                "converting unpickles the checkpoint, which runs any code it holds: pass --trust only for a file "
                "from a source you trust (your own run of an earlier tokenmix)"
            )
        converted, original = convert_checkpoint(args.checkpoint)
    print(f"converted {converted} (the original is kept as {original})")
    return 0
