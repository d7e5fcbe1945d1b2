"""Every op in its forms, with one signature: the reference, the fast path and, where it streams, the decoder.

    form(x, params, initial_state=None, output_final_state=False) -> y, or (y, final_state)

``naive`` is the op's definition (a dense matrix, or a Python loop over time); ``parallel`` the
fast path training runs (FFT, banded convolution, sparse interpolation); ``recurrent`` the path
decoding runs, one token at a time from a state; ``fused``, where an op has one, the parallel form with
its elementwise passes fused into Triton kernels (GPU; on the CPU through Triton's interpreter, for
tests). x is (batch, n, d); ``params`` the op's weights and settings; a state is a tensor or a tuple
of them, the same for every form of an op, and continuing from the final state of a prefix gives the
outputs of the whole sequence.
``tests/ops/test_op_forms.py`` holds every registered op's forms to each other on outputs, final
states and every gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..registry import Registry

Form = Callable[..., torch.Tensor | tuple[torch.Tensor, object]]


@dataclass(frozen=True)
class OpForms:
    """The forms of one op; ``example(batch, n, dim, dtype, generator) -> (x, params, initial_state)``
    draws valid inputs (the initial state None for an op that does not stream); ``fused`` the Triton form, if any."""

    naive: Form
    parallel: Form
    recurrent: Form | None
    example: Callable[..., tuple[torch.Tensor, dict, object]]
    fused: Form | None = None

    @property
    def streams(self) -> bool:
        return self.recurrent is not None


_OPS: Registry[OpForms] = Registry("op")


def register_op(name: str, forms: OpForms) -> OpForms:
    return _OPS.add(name, forms)


def list_ops() -> list[str]:
    return _OPS.names()


def op_forms(name: str) -> OpForms:
    return _OPS[name]


def returned(y: torch.Tensor, state, output_final_state: bool):
    """What a form returns: y, or (y, final state) when asked."""
    return (y, state) if output_final_state else y


def token_by_token(step: Callable, x: torch.Tensor, state) -> tuple[torch.Tensor, object]:
    """The recurrent form's loop: ``step(x_t (batch, 1, d), state) -> (y_t, state)`` over every token."""
    outputs = []
    for t in range(x.shape[1]):
        y, state = step(x[:, t : t + 1], state)
        outputs.append(y)
    return torch.cat(outputs, dim=1), state


def without_state(form: Callable[[torch.Tensor, dict], torch.Tensor]) -> Form:
    """The common signature for an op that does not stream: no initial state, no final state."""

    def run(x: torch.Tensor, params: dict, initial_state=None, output_final_state: bool = False):
        if initial_state is not None or output_final_state:
            raise ValueError("this op does not stream: it takes no initial_state and has no final state")
        return form(x, params)

    return run
