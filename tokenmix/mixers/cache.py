"""One cache for what a mixer derives from its weights or from the length (spectra, interpolation
weights, the taps of streaming), so inference does not rebuild an operator on every call.

A value derived from weights is keyed also by every parameter's storage and in-place version: an
optimizer step, ``load_state_dict``, ``.to()`` or any in-place edit makes it stale. Under autograd
it is computed afresh and nothing is kept, so gradients reach the weights; nor under ``torch.compile``,
whose graph computes it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def weight_versions(module: nn.Module) -> tuple:
    """Each parameter's storage and in-place version: changes whenever a weight does."""
    return tuple((p.data_ptr(), p._version) for p in module.parameters())


class Cache:
    """At most ``size`` values by key, the oldest dropped first."""

    def __init__(self, size: int = 1):
        self.size = size
        self.entries: dict = {}

    def get(self, key, compute: Callable, *, weights: nn.Module | None = None, usable: Callable | None = None):
        """``compute()``, kept under ``key``. ``weights``: the module whose weights it reads (then keyed by
        their versions too, and not kept under autograd); ``usable(value)``: whether a kept value serves
        this call (else it is computed again). Inside ``torch.compile`` nothing is kept: the traced values are not tensors
        a later call could use."""
        if torch.compiler.is_compiling():
            return compute()
        if weights is not None:
            if torch.is_grad_enabled():
                self.clear()
                return compute()
            key = (key, weight_versions(weights))
        value = self.entries.get(key)
        if value is None or (usable is not None and not usable(value)):
            self.entries.pop(key, None)
            while len(self.entries) >= self.size:
                self.entries.pop(next(iter(self.entries)))
            value = self.entries[key] = compute()
        return value

    def clear(self) -> None:
        """Drop every value (training: keep no operator the next step makes stale)."""
        self.entries.clear()
