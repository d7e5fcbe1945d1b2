"""Exact online causal Toeplitz products: y_t = sum_{s <= t} k_{t-s} x_s, one input at a time.

Decoding with a long convolution must produce y_t as soon as x_t is known. Recomputing the
product over the whole history costs O(t) per token (O(t log t) by FFT), O(L^2) in total. The
relaxed (online) multiplication used by Flash Inference (Oncescu et al., "Flash Inference:
Near Linear Time Inference for Long Convolution Sequence Models and Beyond", arXiv 2410.12982,
§3) tiles the strict lower triangle of T by squares instead: once p inputs are known, with
B = 2^v the largest power of two dividing p, the block of inputs [p - B, p) is added to the
outputs [p, p + B), which it reaches through the lags 1 ... 2B - 1. Every (output, input) pair
with input < output lies in exactly one such tile, every tile is complete before its first
output is needed, and a level of size B runs L / (2B) times, so decoding L tokens costs
O(L log^2 L) with an FFT per tile, and every output is exact (no truncation of the kernel).
Small tiles are cheaper as a direct product.

The state holds the input history and the contributions already added to future outputs
("pending"); entries before the current position are always zero, so a state after a parallel
prefill of P inputs (``prefill_state``) equals the state after P single steps.

A decoder that knows where its rows end (``StreamState.limit_steps``: a request's prompt and
``max_tokens``) needs no output at or past the furthest end E: the tile at p adds only its outputs
[p, min(p + B, E)) (by FFT at the fast size past B + E - p points rather than 2B), none at all
from p >= E on. A row's pending sums past its end stay incomplete: it must not be stepped there.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..state import StreamState
from ..validation import check_int
from .fft import fast_fft_size
from .forms import OpForms, register_op, returned
from .toeplitz import naive_toeplitz_matvec, toeplitz_matvec

NO_END = torch.iinfo(torch.int64).max  # a row's end when nobody said (``limit_steps``): every output is made
LIMITED_TILE_MIN = 16  # smaller tiles are added whole: reading the rows' ends would cost more (on a GPU, a wait)
DIRECT_TILE_MAX = 8  # one row's tiles up to this size use the direct product (``direct_tile``)
FFT_GROUP_POINTS = 2**20  # on the CPU, tile FFTs run over row groups of at most this many points (``fft_rows``)


@dataclass
class OnlineToeplitzState(StreamState):
    """inputs, pending: (batch, capacity, d); position: how many inputs have been seen; ends: (batch,)
    the position before which each row's outputs are needed (``NO_END``: all of them)."""

    inputs: torch.Tensor
    pending: torch.Tensor
    position: int = 0
    ends: torch.Tensor | None = None  # None: every row's is NO_END

    def __post_init__(self):
        if self.ends is None:
            self.ends = torch.full((self.inputs.shape[0],), NO_END, dtype=torch.long, device=self.inputs.device)

    def limit_steps(self, steps: torch.Tensor) -> OnlineToeplitzState:
        """Row r's outputs are needed before ``position + steps[r]`` only (``StreamState.limit_steps``)."""
        steps = torch.as_tensor(steps)
        if steps.shape != self.ends.shape or steps.is_floating_point() or steps.dtype == torch.bool:
            rows, got = self.ends.shape[0], f"{steps.dtype} of shape {tuple(steps.shape)}"
            raise ValueError(f"steps must be {rows} integer step counts (one per row), got {got}")
        return dataclasses.replace(self, ends=self.position + steps.to(self.ends))

    @classmethod
    def concat_tensors(cls, name: str, tensors: list[torch.Tensor]) -> torch.Tensor:
        """The histories joined at the largest capacity (zeros past the position, as ``_grow`` adds), in one copy."""
        if name == "ends":
            return torch.cat(tensors)
        first = tensors[0]
        if all(tensor.shape[1] == first.shape[1] for tensor in tensors):
            return torch.cat(tensors)  # no zeros to write first
        joined = first.new_zeros(sum(tensor.shape[0] for tensor in tensors), max(tensor.shape[1] for tensor in tensors), first.shape[2])
        row = 0
        for tensor in tensors:
            joined[row : row + tensor.shape[0], : tensor.shape[1]] = tensor
            row += tensor.shape[0]
        return joined

    @classmethod
    def assign_tensor(cls, name: str, mine: torch.Tensor, rows: list[int], theirs: torch.Tensor) -> torch.Tensor:
        """Rows written in place when they fit the capacity (the rest of each row zeroed: an earlier stream's
        pending sums must not reach the new one); a longer history widens the whole field first."""
        if name == "ends":
            return super().assign_tensor(name, mine, rows, theirs)
        if theirs.shape[1] > mine.shape[1]:
            mine = torch.nn.functional.pad(mine, (0, 0, 0, theirs.shape[1] - mine.shape[1]))
        mine[rows] = 0
        mine[rows, : theirs.shape[1]] = theirs.to(mine.dtype)
        return mine


def empty_state(batch_size: int, dim: int, *, device=None, dtype=torch.float32, capacity: int = 16) -> OnlineToeplitzState:
    check_int(capacity, "capacity")
    zeros = torch.zeros(batch_size, capacity, dim, device=device, dtype=dtype)
    return OnlineToeplitzState(zeros, zeros.clone(), 0)


def padded_state(batch_size: int, dim: int, count: int, *, device=None, dtype=torch.float32) -> OnlineToeplitzState:
    """The state after ``count`` zero inputs: zero history and pending sums (every tile of zeros adds
    nothing), at position ``count``, with the capacity ``prefill_state`` leaves."""
    state = empty_state(batch_size, dim, device=device, dtype=dtype, capacity=_doubled(16, count + 1))
    state.position = count
    return state


def required_lags(position: int) -> int:
    """Kernel taps (lags 0 ... n - 1) that stepping the input at ``position`` needs: n = 2 * (position + 1)."""
    return 2 * (position + 1)


def _tile_size(count: int) -> int:
    """The largest power of two dividing ``count`` >= 1."""
    return count & -count


def _doubled(capacity: int, needed: int) -> int:
    """``capacity`` doubled until it holds ``needed`` positions."""
    while capacity < needed:
        capacity *= 2
    return capacity


def _grow(state: OnlineToeplitzState, needed: int) -> None:
    capacity = _doubled(state.inputs.shape[1], needed)
    pad = capacity - state.inputs.shape[1]
    if pad == 0:
        return
    state.inputs = torch.nn.functional.pad(state.inputs, (0, 0, 0, pad))
    state.pending = torch.nn.functional.pad(state.pending, (0, 0, 0, pad))


def direct_tile(size: int, batch: int, outputs: int | None = None) -> bool:
    """Whether a tile of ``size`` inputs on ``outputs`` (default ``size``) outputs of ``batch`` rows takes
    the direct product (B multiply-adds of (batch, M, d)) rather than FFTs: while B * M is at most
    ``DIRECT_TILE_MAX``^2 * batch (square tiles: up to 8 sqrt(batch) inputs). Many short FFTs along the
    token axis cost far more per point than multiply-adds, and their number grows with the batch, so
    a batch of 64 rows decodes fastest with direct tiles of up to 64 inputs."""
    return size * (size if outputs is None else outputs) <= DIRECT_TILE_MAX**2 * batch


class TileKernels:
    """The kernel as each tile size needs it, computed once per size from taps (n, d) by lag.

    A tile of B inputs on the M <= B outputs after it uses the lags 1 ... B + M - 1: as a (B, B, d)
    matrix of lags B + m - r (by r, then m) for the direct product, or as the rfft of lags 0 ... N - 1
    at N >= B + M points.
    """

    def __init__(self, taps: torch.Tensor):
        if taps.dim() != 2 or not taps.is_floating_point():
            raise ValueError(f"taps must be a real floating point (lags, channels) tensor, got {taps.dtype} of shape {tuple(taps.shape)}")
        self.taps = taps
        self._direct: dict[int, torch.Tensor] = {}
        self._spectra: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return self.taps.shape[0]

    def direct(self, size: int) -> torch.Tensor:
        if size not in self._direct:
            offsets = torch.arange(size, device=self.taps.device)
            self._direct[size] = self.taps[size + offsets[None, :] - offsets[:, None]]
        return self._direct[size]

    def spectrum(self, points: int) -> torch.Tensor:
        if points not in self._spectra:
            self._spectra[points] = torch.fft.rfft(self.taps[:points], n=points, dim=0)
        return self._spectra[points]


def tile_contribution(block: torch.Tensor, kernels: TileKernels, outputs: int | None = None) -> torch.Tensor:
    """c_m = sum_r block_r k_{B + m - r}, r in [0, B), m in [0, M): a block of B inputs on the M
    outputs after it (``outputs``, default M = B).

    block: (batch, B, d). Directly, one multiply-add per input, for small tiles (``direct_tile``);
    otherwise a middle product by FFT at N >= B + M points (2B for a whole tile, else the next fast
    size): the linear convolution's entries B ... B + M - 1 do not wrap around.
    """
    batch, size = block.shape[:2]
    outputs = size if outputs is None else outputs
    if direct_tile(size, batch, outputs):
        kernel = kernels.direct(size)[:, :outputs].to(block.dtype)
        contribution = block[:, 0, None] * kernel[0]
        for r in range(1, size):
            contribution = contribution.addcmul_(block[:, r, None], kernel[r])
        return contribution
    points = 2 * size if outputs == size else fast_fft_size(size + outputs)
    spectrum, rows = kernels.spectrum(points), fft_rows(block, points)
    if rows >= batch:
        return _middle_product(block, spectrum, points, outputs)
    contribution = block.new_empty(batch, outputs, block.shape[2])
    for first in range(0, batch, rows):
        contribution[first : first + rows] = _middle_product(block[first : first + rows], spectrum, points, outputs)
    return contribution


def _middle_product(block: torch.Tensor, spectrum: torch.Tensor, points: int, outputs: int) -> torch.Tensor:
    size = block.shape[1]
    product = torch.fft.rfft(block, n=points, dim=1) * spectrum
    return torch.fft.irfft(product, n=points, dim=1)[:, size : size + outputs].to(block.dtype)


def fft_rows(block: torch.Tensor, points: int) -> int:
    """Rows of ``block`` (batch, B, d) whose tile FFTs (at ``points``) run together: on the CPU as many
    as keep ``points`` * d per row within ``FFT_GROUP_POINTS`` (a batch's FFTs at once leave the cache
    and ran 3 to 4 times slower at 64 rows of 256 inputs); on other devices the whole batch."""
    if block.device.type != "cpu":
        return block.shape[0]
    return max(1, FFT_GROUP_POINTS // (points * block.shape[2]))


def online_step(state: OnlineToeplitzState, x: torch.Tensor, kernels: TileKernels) -> torch.Tensor:
    """y_t for the next input x (batch, d), updating ``state`` in place; kernels: taps >= required_lags(t)."""
    t = state.position
    if len(kernels) < required_lags(t):
        raise ValueError(f"taps must cover lags 0 ... {required_lags(t) - 1} at position {t}, got {len(kernels)} rows")
    size = _tile_size(t + 1)
    outputs = size if size < LIMITED_TILE_MIN else min(size, int(state.ends.max()) - (t + 1))  # none past every row's end
    _grow(state, t + 1 + max(outputs, 0))  # a cut tile needs no room past the furthest end
    state.inputs[:, t] = x
    y = state.pending[:, t] + kernels.taps[0].to(x.dtype) * x
    state.pending[:, t] = 0.0
    if outputs > 0:
        block = state.inputs[:, t + 1 - size : t + 1].clone()  # kept for autograd
        state.pending[:, t + 1 : t + 1 + outputs] += tile_contribution(block, kernels, outputs)
    state.position = t + 1
    return y


def prefill_state(inputs: torch.Tensor, kernels: TileKernels, *, capacity: int = 16) -> OnlineToeplitzState:
    """The state after stepping every input of ``inputs`` (batch, P, d), built from the last tile of
    each size (the only ones that reach past position P); the outputs come from the parallel product."""
    batch, count, dim = inputs.shape
    check_int(capacity, "capacity")
    if count and len(kernels) < required_lags(count - 1):
        raise ValueError(f"taps must cover lags 0 ... {required_lags(count - 1) - 1} for {count} inputs, got {len(kernels)} rows")
    # the pending sums reach the power of two past the position (the largest tile's outputs)
    state = empty_state(batch, dim, device=inputs.device, dtype=inputs.dtype, capacity=_doubled(capacity, count + 1))
    if count == 0:
        return state
    state.inputs[:, :count] = inputs
    size = 1
    while size <= count:
        end = (count // size) * size  # the last multiple of size, if size is its largest power-of-two factor
        if end > 0 and _tile_size(end) == size and end + size > count:
            contribution = tile_contribution(inputs[:, end - size : end], kernels)
            state.pending[:, count : end + size] += contribution[:, count - end :]
        size *= 2
    state.position = count
    return state


def naive_online_step(history: torch.Tensor, taps: torch.Tensor) -> torch.Tensor:
    """Reference: the output at the last position of ``history`` (batch, t + 1, d), sum_s k_{t-s} x_s."""
    t = history.shape[1] - 1
    return torch.einsum("bsd,sd->bd", history, taps[: t + 1].flip(0).to(history.dtype))


# -- the causal Toeplitz product in its three forms (``ops/forms.py``); the state: every input so far ------


def _with_history(form):
    def run(x: torch.Tensor, params: dict, initial_state=None, output_final_state: bool = False):
        full = x if initial_state is None else torch.cat([initial_state, x], dim=1)
        y = form(full, params["kernel"][: full.shape[1]], True)[:, full.shape[1] - x.shape[1] :]
        return returned(y, full, output_final_state)

    return run


def recurrent_toeplitz(x: torch.Tensor, params: dict, initial_state=None, output_final_state: bool = False):
    """One input at a time by ``online_step``, from the state ``prefill_state`` builds of the earlier inputs."""
    kernels = TileKernels(params["kernel"])
    state = prefill_state(x[:, :0] if initial_state is None else initial_state, kernels)
    y = torch.stack([online_step(state, x[:, t], kernels) for t in range(x.shape[1])], dim=1)
    return returned(y, state.inputs[:, : state.position], output_final_state)


def _toeplitz_example(batch: int, n: int, dim: int, dtype: torch.dtype, generator: torch.Generator):
    before = n // 3
    lags = torch.arange(required_lags(before + n), dtype=dtype)[:, None]
    kernel = torch.randn(lags.shape[0], dim, dtype=dtype, generator=generator) * 0.9**lags
    x, history = (torch.randn(batch, length, dim, dtype=dtype, generator=generator) for length in (n, before))
    return x, {"kernel": kernel}, history


register_op(
    "causal_toeplitz",
    OpForms(_with_history(naive_toeplitz_matvec), _with_history(toeplitz_matvec), recurrent_toeplitz, _toeplitz_example),
)
