"""Argument parsers shared by the CLI subcommands: each refuses bad values with the accepted ones."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def parse_lengths(text: str) -> list[int]:
    """Comma-separated positive integers, e.g. ``512,1024``."""
    try:
        lengths = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"lengths must be comma-separated integers, got {text!r}") from None
    if min(lengths) < 1:
        raise argparse.ArgumentTypeError(f"lengths must be positive integers, got {text!r}")
    return lengths


def parse_names(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give at least one name")
    return names


def parse_option(text: str) -> tuple[str, object]:
    """KEY=VALUE with VALUE read as JSON when it parses (numbers, true/false, null, lists), else a string."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"--option must look like KEY=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def integer(minimum: int):
    """An argparse type: an integer >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}")
        return value

    return parse


def number(minimum: float = -math.inf, open_minimum: bool = False):
    """An argparse type: a finite float >= ``minimum`` (> with ``open_minimum``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < minimum or (open_minimum and value == minimum):
            bound = "" if minimum == -math.inf else f" {'>' if open_minimum else '>='} {minimum:g}"
            raise argparse.ArgumentTypeError(f"must be a finite number{bound}, got {text!r}")
        return value

    return parse


def check_output_path(path: str | None, flag: str, directory: bool = False) -> None:
    """Fail before long work, not after it: create the folder a result goes to, and refuse a file
    where a folder is wanted (``directory``) or a folder where a file is."""
    if path is None:
        return
    target = Path(path)
    if directory and target.is_file():
        raise ValueError(f"{flag} {path!r} is a file; give a folder")
    if not directory and target.is_dir():
        raise ValueError(f"{flag} {path!r} is a directory; give a file name")
    try:
        (target if directory else target.parent).mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(f"{flag} {path!r}: cannot create its folder ({error.strerror})") from None
