"""Multi-dimensional damped EMA (MEGA, Ma et al. 2023, §3.1; the baseline of TCNCA, Terzić et al. 2023).

Per channel d with N expansion dimensions j, input weights b_dj, decays q_dj in (0, 1) and
readout weights c_dj, the recurrence

    h_t = b * x_t + q * h_{t-1},   y_t = sum_j c_j h_t[j]

unrolls to a causal convolution y = k * x with k_d[l] = sum_j c_dj b_dj q_dj^l. Training applies
it by FFT (``ops/toeplitz.py``) with the kernel generated for every lag: O(d N n + d n log n).
A chunk that starts from a state h (decoding) adds sum_j c_j q_j^(t+1) h[j] to the chunk's own
convolution at its position t, and leaves h' = q^k h + sum_s b q^(k-1-s) x_s after k inputs.
"""

from __future__ import annotations

import torch

from .forms import OpForms, register_op, returned, token_by_token
from .toeplitz import toeplitz_matvec


def _check_ema(input_weight: torch.Tensor, decay: torch.Tensor, readout: torch.Tensor) -> None:
    if input_weight.dim() < 2 or decay.shape != input_weight.shape or readout.shape != input_weight.shape:
        shapes = [tuple(t.shape) for t in (input_weight, decay, readout)]
        raise ValueError(f"input_weight, decay and readout must share one (..., channels, ndim) shape, got {shapes}")


def ema_kernel(input_weight: torch.Tensor, decay: torch.Tensor, readout: torch.Tensor, n: int) -> torch.Tensor:
    """k[l, d] = sum_j c_dj b_dj q_dj^l for lags l = 0 .. n-1, q^l = exp(l log q).

    Coefficients (..., channels, ndim) -> kernel (..., n, channels).
    """
    _check_ema(input_weight, decay, readout)
    lags = torch.arange(n, device=decay.device, dtype=decay.dtype)
    powers = torch.exp(decay.log()[..., None] * lags)  # (..., d, N, n)
    return torch.einsum("...dj,...djl->...ld", readout * input_weight, powers)


def naive_ema(
    x: torch.Tensor,
    input_weight: torch.Tensor,
    decay: torch.Tensor,
    readout: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
):
    """Reference: the recurrence as a Python loop over time; x (batch, n, d) -> y (batch, n, d), and the
    state h (batch, d, N) after it when ``output_final_state`` (from ``initial_state``, zeros by default).

    Coefficients (channels, ndim).
    """
    _check_ema(input_weight, decay, readout)
    state = x.new_zeros(x.shape[0], *decay.shape) if initial_state is None else initial_state
    outputs = []
    for t in range(x.shape[1]):
        state = input_weight * x[:, t, :, None] + decay * state
        outputs.append((readout * state).sum(-1))
    return returned(torch.stack(outputs, dim=1), state, output_final_state)


def ema_chunk(
    x: torch.Tensor, state: torch.Tensor, input_weight: torch.Tensor, decay: torch.Tensor, readout: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrence over a chunk x (batch, k, d) from ``state`` (batch, d, N): (y (batch, k, d), new state).

    The chunk's own convolution by FFT plus the decayed state, and the closed-form final state, in
    O(k d N + d k log k). Coefficients (channels, ndim).
    """
    _check_ema(input_weight, decay, readout)
    k = x.shape[1]
    state = state.to(decay.dtype)
    if k == 1:  # one input: the recurrence itself
        new_state = input_weight * x[:, 0, :, None].to(decay.dtype) + decay * state
        return (readout * new_state).sum(-1)[:, None].to(x.dtype), new_state
    steps = torch.arange(k + 1, device=decay.device, dtype=decay.dtype)
    powers = torch.exp(decay.log()[..., None] * steps)  # q^0 ... q^k, (d, N, k + 1)
    kernel = torch.einsum("dj,djl->ld", readout * input_weight, powers[..., :k])
    carried = torch.einsum("dj,djt,bdj->btd", readout, powers[..., 1:], state)
    y = toeplitz_matvec(x, kernel.to(x.dtype), causal=True) + carried.to(x.dtype)
    new_state = powers[..., k] * state + torch.einsum("dj,djs,bsd->bdj", input_weight, powers[..., :k].flip(-1), x.to(decay.dtype))
    return y, new_state


# -- the forms of ``ops/forms.py``: params input_weight, decay, readout (channels, ndim); the state h ------


def _coefficients(params: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return params["input_weight"], params["decay"], params["readout"]


def _zero_state(x: torch.Tensor, params: dict, state: torch.Tensor | None) -> torch.Tensor:
    return x.new_zeros(x.shape[0], *params["decay"].shape) if state is None else state


def naive_ema_form(x: torch.Tensor, params: dict, initial_state=None, output_final_state: bool = False):
    return naive_ema(x, *_coefficients(params), initial_state, output_final_state)


def parallel_ema(x: torch.Tensor, params: dict, initial_state=None, output_final_state: bool = False):
    """The whole sequence by ``ema_chunk``: its kernel by FFT and the closed-form final state."""
    return returned(*ema_chunk(x, _zero_state(x, params, initial_state), *_coefficients(params)), output_final_state)


def recurrent_ema(x: torch.Tensor, params: dict, initial_state=None, output_final_state: bool = False):
    """One input at a time (``ema_chunk`` of one input is the recurrence itself)."""
    step = lambda token, state: ema_chunk(token, state, *_coefficients(params))  # noqa: E731
    return returned(*token_by_token(step, x, _zero_state(x, params, initial_state)), output_final_state)


def _ema_example(batch: int, n: int, dim: int, dtype: torch.dtype, generator: torch.Generator):
    ndim = 3
    input_weight, readout = (torch.randn(dim, ndim, dtype=dtype, generator=generator) for _ in range(2))
    decay = torch.sigmoid(torch.randn(dim, ndim, dtype=dtype, generator=generator) + 1.0)
    x = torch.randn(batch, n, dim, dtype=dtype, generator=generator)
    return (
        x,
        {"input_weight": input_weight, "decay": decay, "readout": readout},
        torch.randn(batch, dim, ndim, dtype=dtype, generator=generator),
    )


register_op("ema", OpForms(naive_ema_form, parallel_ema, recurrent_ema, _ema_example))
