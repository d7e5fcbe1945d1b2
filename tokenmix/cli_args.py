"""Argument parsers shared by the CLI subcommands."""

from __future__ import annotations

import argparse
import json


def parse_lengths(text: str) -> list[int]:
    """Comma-separated positive integers, e.g. ``512,1024``."""
    try:
        lengths = [int(part) for part in text.split(",") if part]
    except ValueError:
        raise argparse.ArgumentTypeError(f"lengths must be comma-separated integers, got {text!r}") from None
    if not lengths or min(lengths) < 1:
        raise argparse.ArgumentTypeError(f"lengths must be positive integers, got {text!r}")
    return lengths


def parse_names(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give at least one name")
    return names


def parse_option(text: str) -> tuple[str, object]:
    """KEY=VALUE with VALUE read as JSON when it parses (numbers, true/false, lists), else a string."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"--option must look like KEY=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value
