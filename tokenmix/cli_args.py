"""Argument parsers shared by the CLI subcommands."""

from __future__ import annotations

import argparse


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
