"""Checks of user-given options, shared by every layer: a ValueError names the argument."""

from __future__ import annotations


def check_int(value, argument: str, minimum: int = 1, maximum: int | None = None) -> int:
    """``value`` must be an int (not a bool) in [minimum, maximum]; returns it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (maximum is not None and value > maximum):
        bounds = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{argument} must be an integer {bounds}, got {value!r}")
    return value
