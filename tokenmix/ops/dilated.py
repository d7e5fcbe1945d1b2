"""Dilated depthwise convolution, the layer of a temporal convolutional network (TCNCA, Terzić et al. 2023, §2).

Per channel y_i = sum_{k=0}^{K-1} f_k x_{i - (min_lag + k) * delta}, x zero outside [0, n):
K taps at lags min_lag, ..., min_lag + K - 1 in units of the dilation delta (causal: min_lag = 0;
centred: min_lag = -(K // 2)). It runs on the banded product of ``band.py`` (a oneDNN depthwise
convolution down the rows of the (length / delta, delta) phase image, a blocked-matmul filter
gradient), after dropping the taps whose lag reaches past both ends of the sequence: with
R = ceil(n / delta) rows, lags beyond +-(R - 1) multiply zeros only.
"""

from __future__ import annotations

import torch

from ..validation import check_int
from .band import band_matvec
from .forms import OpForms, register_op, returned, token_by_token, without_state


def dilated_conv(x: torch.Tensor, taps: torch.Tensor, dilation: int, min_lag: int) -> torch.Tensor:
    """y_i = sum_k f_k x_{i - (min_lag + k) dilation}; x (batch, n, d), taps (d, K); ValueError on bad shapes."""
    check_int(dilation, "dilation")
    if x.dim() == 3 and taps.dim() == 2 and -(taps.shape[1] - 1) <= min_lag <= 0:
        rows = -(-x.shape[1] // dilation)
        first = min_lag if min_lag >= 1 - rows else 1 - rows  # comparisons, not max/min: simple guards under torch.compile
        last = min_lag + taps.shape[1] - 1 if min_lag + taps.shape[1] - 1 <= rows - 1 else rows - 1
        taps, min_lag = taps[:, first - min_lag : last - min_lag + 1], first
    return band_matvec(x, taps, min_lag, dilation)


def naive_dilated_conv(x: torch.Tensor, taps: torch.Tensor, dilation: int, min_lag: int) -> torch.Tensor:
    """Reference: a Python loop over the taps, shifting x by each tap's lag (tests only)."""
    n = x.shape[1]
    y = torch.zeros_like(x)
    for k in range(taps.shape[1]):
        shift = (min_lag + k) * dilation  # y_i += f_k x_{i - shift}
        if abs(shift) >= n:
            continue
        if shift >= 0:
            y[:, shift:] = y[:, shift:] + taps[:, k] * x[:, : n - shift]
        else:
            y[:, :shift] = y[:, :shift] + taps[:, k] * x[:, -shift:]
    return y


def causal_dilated_chunk(x: torch.Tensor, history: torch.Tensor, taps: torch.Tensor, dilation: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The causal convolution (min_lag 0) of a chunk x (batch, k, d) that follows ``history``, the last
    (K - 1) * dilation inputs before it (zeros at the start): (y (batch, k, d), the history after x).

    Decoding: O(K k d) per chunk, whatever the position.
    """
    check_int(dilation, "dilation")
    span = (taps.shape[1] - 1) * dilation
    if history.shape[1] != span:
        raise ValueError(f"history must hold the last (K - 1) * dilation = {span} inputs, got {history.shape[1]}")
    window = torch.cat([history, x], dim=1)
    k = x.shape[1]
    y = sum(taps[:, j] * window[:, span - j * dilation : span - j * dilation + k] for j in range(taps.shape[1]))
    return y, window[:, k:].clone()  # not a view: the state holds the history only


# -- the forms of ``ops/forms.py``: params taps (d, K) and dilation; causal: the state is the last span inputs --


def _causal_with_history(convolution):
    def run(x: torch.Tensor, params: dict, initial_state=None, output_final_state: bool = False):
        taps, dilation = params["taps"], params["dilation"]
        span = (taps.shape[1] - 1) * dilation
        history = x.new_zeros(x.shape[0], span, x.shape[2]) if initial_state is None else initial_state
        full = torch.cat([history, x], dim=1)
        return returned(convolution(full, taps, dilation, 0)[:, span:], full[:, full.shape[1] - span :], output_final_state)

    return run


def recurrent_dilated_conv(x: torch.Tensor, params: dict, initial_state=None, output_final_state: bool = False):
    """One input at a time by ``causal_dilated_chunk``."""
    taps, dilation = params["taps"], params["dilation"]
    history = x.new_zeros(x.shape[0], (taps.shape[1] - 1) * dilation, x.shape[2]) if initial_state is None else initial_state
    step = lambda token, state: causal_dilated_chunk(token, state, taps, dilation)  # noqa: E731
    return returned(*token_by_token(step, x, history), output_final_state)


def _centred(convolution):
    return without_state(lambda x, params: convolution(x, params["taps"], params["dilation"], -(params["taps"].shape[1] // 2)))


def _dilated_example(causal: bool):
    def example(batch: int, n: int, dim: int, dtype: torch.dtype, generator: torch.Generator):
        taps, dilation = torch.randn(dim, 3, dtype=dtype, generator=generator), 2
        x = torch.randn(batch, n, dim, dtype=dtype, generator=generator)
        history = torch.randn(batch, 2 * dilation, dim, dtype=dtype, generator=generator) if causal else None
        return x, {"taps": taps, "dilation": dilation}, history

    return example


register_op(
    "causal_dilated_conv",
    OpForms(_causal_with_history(naive_dilated_conv), _causal_with_history(dilated_conv), recurrent_dilated_conv, _dilated_example(True)),
)
register_op("dilated_conv", OpForms(_centred(naive_dilated_conv), _centred(dilated_conv), None, _dilated_example(False)))
