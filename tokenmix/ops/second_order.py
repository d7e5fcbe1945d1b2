"""The switch for second derivatives (Hessian-vector products, gradient penalties): ``double_backward()``.

First-order training should not pay for what a second derivative needs. Forwards run inside the
block keep it: the Toeplitz Functions (``ops/toeplitz.py``) keep x beside rfft(x), about 8 % more
activation memory in a TNN layer; attention (``ops/attention.py``) runs PyTorch's reference (math)
kernel, which keeps the (n, n) attention probabilities, because the fused kernels have no second
derivative. Outside the block, a second derivative through either raises instead of being wrong.
"""

from __future__ import annotations

import contextlib

_enabled = [False]


@contextlib.contextmanager
def double_backward(enabled: bool = True):
    """Second derivatives through the forwards run inside this block (see the module docstring)."""
    _enabled.append(bool(enabled))
    try:
        yield
    finally:
        _enabled.pop()


def double_backward_enabled() -> bool:
    """True inside ``double_backward()``."""
    return _enabled[-1]
