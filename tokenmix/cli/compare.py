"""``tokenmix compare``: the speed-ups between two ``tokenmix bench --output`` files (before, after)."""

from __future__ import annotations

from ..bench.compare import comparison_table
from ..errors import user_input
from ..fields import Existing


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("compare", help="compare two `tokenmix bench --output` JSON files (before, after)")
    parser.add_argument("before", type=Existing("a bench JSON file"), help="JSON of the earlier measurement")
    parser.add_argument("after", type=Existing("a bench JSON file"), help="JSON of the later measurement")
    parser.set_defaults(handler=run_compare)


def run_compare(args) -> int:
    with user_input():
        print(comparison_table(args.before, args.after))
    return 0
