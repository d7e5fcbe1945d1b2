"""Checks of user-given options and inputs, shared by every layer: a ValueError names the argument."""

from __future__ import annotations

import contextlib
import math
import os

import torch

FINITE_CHECK_VARIABLE = "TOKENMIX_CHECK_FINITE"
_finite_checks = [os.environ.get(FINITE_CHECK_VARIABLE, "0") == "1"]


def check_int(value, argument: str, minimum: int = 1, maximum: int | None = None) -> int:
    """``value`` must be an int (not a bool) in [minimum, maximum]; returns it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (maximum is not None and value > maximum):
        bounds = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{argument} must be an integer {bounds}, got {value!r}")
    return value


def check_number(
    value,
    argument: str,
    minimum: float | None = None,
    maximum: float | None = None,
    *,
    open_minimum: bool = False,
    open_maximum: bool = False,
) -> float:
    """``value`` must be a finite real number (not a bool) within the bounds; returns it as float."""
    bad = isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
    if not bad:
        below = minimum is not None and (value <= minimum if open_minimum else value < minimum)
        above = maximum is not None and (value >= maximum if open_maximum else value > maximum)
        bad = below or above
    if bad:
        low = "" if minimum is None else f"{'>' if open_minimum else '>='} {minimum}"
        high = "" if maximum is None else f"{'<' if open_maximum else '<='} {maximum}"
        bounds = " and ".join(part for part in (low, high) if part)
        raise ValueError(f"{argument} must be a finite number{' ' + bounds if bounds else ''}, got {value!r}")
    return float(value)


def finite_checks_enabled() -> bool:
    return _finite_checks[-1]


@contextlib.contextmanager
def check_finite_inputs(enabled: bool = True):
    """Debug mode: every mixer refuses NaN or Inf at a real (unpadded) input position.

    A causal FFT mixer would otherwise carry a NaN at position t to every output, earlier ones
    included: the FFT mixes all positions, so causality holds for finite inputs only. Also on for
    the whole process with ``TOKENMIX_CHECK_FINITE=1`` (``tokenmix train --check-finite``).
    """
    _finite_checks.append(bool(enabled))
    try:
        yield
    finally:
        _finite_checks.pop()


def set_finite_checks(enabled: bool) -> None:
    """Turn the debug check of ``check_finite_inputs`` on or off for the rest of the process."""
    _finite_checks[0] = bool(enabled)
    _finite_checks[1:] = []


def check_finite(x: torch.Tensor, mask: torch.Tensor | None, argument: str = "x") -> None:
    """ValueError naming the first (batch, position) whose features hold NaN or Inf (padding ignored)."""
    bad = ~torch.isfinite(x).reshape(x.shape[0], x.shape[1], -1).all(-1)
    if mask is not None:
        bad &= mask
    if bool(bad.any()):
        batch, position = (int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"{argument} holds NaN or Inf at batch {batch}, position {position} ({int(bad.sum())} positions in all): "
            "an FFT mixer would spread it to every position, earlier ones included"
        )
