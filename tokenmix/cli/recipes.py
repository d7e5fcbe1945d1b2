"""``tokenmix recipes``: the named presets and the flags each sets."""

from __future__ import annotations

import json

from ..errors import user_input
from ..fields import Choice
from ..train.recipes import list_recipes, recipe


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("recipes", help="the presets of `tokenmix train --recipe NAME`, with their sources")
    parser.add_argument("name", nargs="?", type=Choice(list_recipes), help="one recipe: every value it sets, as train flags")
    parser.set_defaults(handler=run_recipes)


def recipe_flags(settings: dict) -> list[str]:
    """A recipe's settings as ``tokenmix train`` flags (model options as ``-o key=value``, values as -o reads them)."""

    def shown(value) -> str:
        return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))

    flags = [f"--{key.replace('_', '-')} {value}" for key, value in settings.items() if key != "options" and value is not None]
    return flags + [f"-o {key}={shown(value)}" for key, value in settings.get("options", {}).items()]


def run_recipes(args) -> int:
    with user_input():
        chosen = recipe(args.name) if args.name else None
    if chosen is None:
        width = max(map(len, list_recipes())) + 1
        for name in list_recipes():
            print(f"{name:<{width}} {recipe(name).description}")
        print("\n`tokenmix recipes NAME`: a recipe's source and values; `tokenmix train --recipe NAME [flags]` trains with them")
        return 0
    print(f"{args.name}: {chosen.description}\nsource: {chosen.source}\n")
    print(f"`tokenmix train --recipe {args.name}` trains with these settings (flags given beside it override them):")
    print(" \\\n  ".join(["tokenmix train", *recipe_flags(chosen.settings)]))
    return 0
