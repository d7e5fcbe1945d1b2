"""Diagonal state spaces with complex modes: a causal convolution whose kernel is a sum of damped
complex exponentials (the modal form of LaughingHyena, Massaroli et al. 2023, arXiv 2310.18780, §3).

Per channel c with N modes of poles p_cn (0 < |p| < 1) and residues r_cn, the recurrence

    s_t = p * s_{t-1} + u_t,   y_t = Re sum_n r_n s_t[n]

unrolls to y = k * u with k_c[l] = Re sum_n r_cn p_cn^l: the state is N complex numbers per channel
whatever the position. A chunk of k inputs from a state s adds Re sum_n r_n p_n^(t+1) s[n] to the
chunk's own convolution at its position t and leaves s' = p^k s + sum_t p^(k-1-t) u_t (MEGA's EMA,
``ops/ema.py``, is the case of real poles). Powers are exp(l log p), in complex64 for float32
inputs, complex128 for float64.
"""

from __future__ import annotations

import torch

from .forms import returned
from .toeplitz import toeplitz_matvec

BLOCK = 512  # tokens of a chunk from a state whose powers are held at once
GROUP_ROWS = 16384  # batch x tokens of a long chunk's blocks taken in one call


def _check_modes(poles: torch.Tensor, residues: torch.Tensor) -> None:
    if not poles.is_complex() or poles.dim() != 2 or residues.shape != poles.shape or not residues.is_complex():
        shapes = [(tuple(t.shape), t.dtype) for t in (poles, residues)]
        raise ValueError(f"poles and residues must be complex tensors of one (channels, modes) shape, got {shapes}")


def modal_powers(poles: torch.Tensor, count: int) -> torch.Tensor:
    """p^0 ... p^(count - 1) of poles (channels, N): (channels, N, count). As p^(qB + i) = p^(qB) p^i with
    B ~ sqrt(count), only about 2 sqrt(count) powers per pole are complex exponentials; the rest are products."""
    within, starts = _power_blocks(poles, count)
    return (starts[..., :, None] * within[..., None, :]).flatten(-2)[..., :count]


def _power_blocks(poles: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(p^i for i < B, p^(qB) for q < ceil(count / B)), each (channels, N, .), B the least power of two with B^2 >= count
    (found by comparisons alone: under ``torch.compile`` one graph serves every count up to B^2)."""
    size = 1
    while size * size < count:
        size *= 2
    blocks = -(-count // size)  # <= size
    steps = torch.arange(size, device=poles.device, dtype=poles.real.dtype)
    logs = poles.log()[..., None]
    return torch.exp(logs * steps[:size]), torch.exp(logs * (steps[:blocks] * size))


def modal_kernel(poles: torch.Tensor, residues: torch.Tensor, n: int) -> torch.Tensor:
    """k[l, c] = Re sum_n r_cn p_cn^l for lags l = 0 .. n-1: (n, channels), real, contracted block by block
    (``modal_powers``' p^(qB) p^i): no (channels, N, n) tensor of powers is formed."""
    _check_modes(poles, residues)
    within, starts = _power_blocks(poles, n)
    return torch.einsum("cj,cjq,cji->qic", residues, starts, within).real.flatten(0, 1)[:n]


def naive_modal(u: torch.Tensor, poles: torch.Tensor, residues: torch.Tensor, initial_state=None, output_final_state: bool = False):
    """Reference: the recurrence as a Python loop over time; u (batch, n, channels) -> y (batch, n, channels),
    and the state s (batch, channels, N) after it when ``output_final_state`` (from ``initial_state``, zeros)."""
    _check_modes(poles, residues)
    state = torch.zeros(u.shape[0], *poles.shape, dtype=poles.dtype, device=u.device) if initial_state is None else initial_state
    outputs = []
    for t in range(u.shape[1]):
        state = poles * state + u[:, t, :, None]
        outputs.append((residues * state).sum(-1).real)
    return returned(torch.stack(outputs, dim=1).to(u.dtype), state, output_final_state)


def modal_chunk(u: torch.Tensor, state: torch.Tensor, poles: torch.Tensor, residues: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrence over a chunk u (batch, k, channels) from ``state`` (batch, channels, N) complex:
    (y (batch, k, channels), the state after it), the chunk's own convolution by FFT plus the carried
    state, in O(k d N + d k log k). A long chunk (a prompt) goes ``BLOCK`` tokens at a time, many blocks
    in one call (``_modal_blocks``)."""
    _check_modes(poles, residues)
    k, state = u.shape[1], state.to(poles.dtype)
    if k == 1:  # one token (decoding): the recurrence itself
        state = poles * state + u[:, 0, :, None].to(poles.dtype)
        return (residues * state).sum(-1).real[:, None].to(u.dtype), state
    if k <= BLOCK:
        return _modal_block(u, state, poles, residues)
    outputs, group = [], BLOCK * max(1, GROUP_ROWS // (BLOCK * max(1, u.shape[0])))
    full = k - k % BLOCK
    for start in range(0, full, group):
        y, state = _modal_blocks(u[:, start : min(start + group, full)], state, poles, residues)
        outputs.append(y)
    if full < k:
        y, state = _modal_block(u[:, full:], state, poles, residues)
        outputs.append(y)
    return torch.cat(outputs, dim=1), state


def _modal_block(u: torch.Tensor, state: torch.Tensor, poles: torch.Tensor, residues: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``modal_chunk`` for one chunk of k <= BLOCK tokens: its powers p^0 .. p^k held at once."""
    k = u.shape[1]
    powers = modal_powers(poles, k + 1)  # p^0 ... p^k, (channels, N, k + 1)
    kernel = torch.einsum("cj,cjl->lc", residues, powers[..., :k]).real
    carried = torch.einsum("cj,cjt,bcj->btc", residues, powers[..., 1:], state).real
    y = toeplitz_matvec(u, kernel.to(u.dtype), causal=True) + carried.to(u.dtype)
    return y, powers[..., k] * state + _fed(u, powers[..., :k].flip(-1))


def _fed(u: torch.Tensor, powers: torch.Tensor) -> torch.Tensor:
    """sum_s powers[c, j, s] u[..., s, c] -> (..., channels, N): inputs carried to a block's end, as two real
    contractions (the inputs are real)."""
    real = u.to(powers.real.dtype)
    return torch.complex(torch.einsum("cjs,...sc->...cj", powers.real, real), torch.einsum("cjs,...sc->...cj", powers.imag, real))


def _modal_blocks(u: torch.Tensor, state: torch.Tensor, poles: torch.Tensor, residues: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``modal_chunk`` over q whole blocks u (batch, q BLOCK, channels) at once: every block's own convolution in
    one FFT call, what each block's inputs add to the state at its end in one contraction, the states at the
    blocks' starts by a scan over q (s_(j+1) = p^B s_j + fed_j), and each block's carried term from its start."""
    batch, length, channels = u.shape
    blocks = length // BLOCK
    powers = modal_powers(poles, BLOCK + 1)  # the same for every block
    kernel = torch.einsum("cj,cjl->lc", residues, powers[..., :BLOCK]).real
    y = toeplitz_matvec(u.reshape(batch * blocks, BLOCK, channels), kernel.to(u.dtype), causal=True)
    fed = _fed(u.reshape(batch, blocks, BLOCK, channels), powers[..., :BLOCK].flip(-1))  # (batch, q, channels, N)
    starts = []
    for block in range(blocks):
        starts.append(state)
        state = powers[..., BLOCK] * state + fed[:, block]
    carried = torch.einsum("cj,cjt,bqcj->bqtc", residues, powers[..., 1:], torch.stack(starts, dim=1)).real
    return (y.reshape(batch, blocks, BLOCK, channels) + carried.to(u.dtype)).reshape(batch, length, channels), state
