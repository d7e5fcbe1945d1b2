"""2-D Toeplitz mixers on an H x W token grid, row-major: ``tno2d`` and ``separable2d``.

``tno2d`` ("Toeplitz Neural Network for Sequence Modeling", Qin et al., arXiv 2305.04749, §3.2-3.4
on a grid, the operator of its image model): per channel y[i, j] = sum t[i - i', j - j'] x[i', j']
with t[di, dj] = lambda^(|di| + |dj|) RPE(di, dj), tno's RPE with the 2-D offset as input
(Linear(2, e) first). Block Toeplitz with Toeplitz blocks, applied by 2-D FFT (ops/toeplitz2d.py).
As in tno the spectrum factors through the RPE's output layer (W, b):
rfft2(lambda^(|di|+|dj|) (H W + b)) = rfft2([lambda H, lambda]) @ [W; b], e + 1 transforms, one matmul.

``separable2d`` ("SKI to go Faster: Accelerating Toeplitz Neural Networks via Asymmetric Kernels",
Moreno et al., arXiv 2305.09028, §5.2: the 2-D tasks "treated as separate 1D sequences in each
dimension"): a bidirectional 1-D mixer (``axis_mixer``: tno, ski_tno or fd_tno, with its own
options) along every row, then a second one along every column. Per channel y = (C kron R) x, C
(H x H) and R (W x W) the two 1-D operators: a 2-D kernel of rank one, t[di, dj] = c[di] r[dj].

Grids: ``grid=(H, W)`` takes sequences of exactly H * W tokens; ``grid=None`` lays any length L on
the near-square grid W = ceil(sqrt(L)), H = ceil(L / W) (square for square L), the tail zero-padded
and cut off the output. ``forward(x, mask, grid=...)`` overrides the grid for one call.
Bidirectional only: there is no causal order on a grid.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..fields import Pair, setting
from ..ops.toeplitz import complex_readout
from ..ops.toeplitz2d import fft_grid, naive_toeplitz2d_matrix, near_square_grid, spectral_matvec2d, toeplitz2d_spectrum
from ..options import Options
from .base import Mixer
from .cache import Cache
from .parts import Part
from .registry import list_mixers, mixer_class, register_mixer
from .rpe import RelativePositionEncoder, RpeOptions
from .tno import DecayOptions, ExponentialDecay, relative_lags

GRID = Pair("H, W")


def check_grid(grid) -> list[int] | None:
    """None, or [H, W] from two positive integers (a tuple, or the list a JSON config holds)."""
    return GRID.check(grid, "grid")


@dataclass
class GridOptions(Options):
    grid: list[int] | None = setting(None, GRID, "[H, W] of the token grid; none: the most square grid of the length")


class GridMixer(Mixer):
    """A bidirectional mixer of tokens on a row-major grid: pads to the grid, ``mix_grid``, cuts the tail off."""

    causal_modes = (False,)
    token_axes = 2
    channelwise_linear = True  # separable2d: as its axis mixers are

    def __init__(self, dim: int, causal: bool, options: Options | None = None):
        if causal:
            raise ValueError(f"{type(self).__name__} mixes a 2-D grid in every direction and has no causal mode: use causal=False")
        super().__init__(dim, causal, options)
        self.grid = self.options.grid

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, *, grid=None) -> torch.Tensor:
        """``grid``: (H, W) for this call instead of the module's own."""
        return self.checked_mix(x, mask, grid=check_grid(grid))

    def grid_for(self, length: int, grid: list[int] | None = None) -> tuple[int, int]:
        """(H, W) of a sequence of ``length`` tokens: ``grid`` (this call's), the module's, or near square."""
        grid = grid or self.grid
        if grid is None:
            return near_square_grid(length)
        rows, columns = grid
        if rows * columns != length:
            raise ValueError(
                f"grid={grid} holds {rows * columns} tokens but the sequence has length {length}: "
                f"give a grid with H * W = {length}, or grid=None for a near-square one"
            )
        return rows, columns

    def mix(self, x: torch.Tensor, mask: torch.Tensor | None, grid: list[int] | None = None) -> torch.Tensor:
        return self.mix_channels(x, mask, slice(None), grid)

    def mix_channels(self, x: torch.Tensor, mask: torch.Tensor | None, channels: slice, grid: list[int] | None = None) -> torch.Tensor:
        """Channels ``channels`` of the output from x (batch, n, those channels): padded to the grid, mixed, cut to n."""
        n = x.shape[1]
        rows, columns = self.grid_for(n, grid)
        return self.mix_grid(F.pad(x, (0, 0, 0, rows * columns - n)), (rows, columns), channels)[:, :n]

    def mix_grid(self, x: torch.Tensor, grid: tuple[int, int], channels: slice) -> torch.Tensor:  # pragma: no cover - abstract
        """Mix x (batch, H * W, the channels ``channels``) on the grid (H, W)."""
        raise NotImplementedError

    def operator_matrix(self, grid: tuple[int, int], channels: slice = slice(None)) -> torch.Tensor:  # pragma: no cover
        """The explicit (channels, HW, HW) matrix on ``grid``."""
        raise NotImplementedError

    def operator_matrices(self, n: int, channels: slice = slice(None)) -> dict[str, torch.Tensor]:
        """The explicit (channels, n, n) matrix at length n, on the grid ``forward`` would use (tests and plots)."""
        return {"T": self.operator_matrix(self.grid_for(n), channels)[:, :n, :n]}

    def extra_repr(self) -> str:
        return f"dim={self.dim}, grid={self.grid}"


@dataclass
class Tno2dOptions(DecayOptions, RpeOptions, GridOptions):
    pass


@register_mixer("tno2d")
class Tno2d(GridMixer):
    """TNN's 2-D Toeplitz neural operator (name ``tno2d``)."""

    options_type = Tno2dOptions
    fft_based = True
    inner_precision = "float32"  # 2-D FFT products; the RPE reads offsets up to the grid's size
    channel_slices = True  # a channel's kernel is its column of the RPE's output layer

    def __init__(self, dim: int, causal: bool = False, options: Tno2dOptions | None = None):
        super().__init__(dim, causal, options)
        o = self.options
        self.rpe = RelativePositionEncoder(dim, o.rpe_dim, o.rpe_layers, o.activation, in_features=2)
        self.decay = ExponentialDecay(o.decay, o.learnable_decay)
        self._cache = Cache()

    def offsets(self, grid: tuple[int, int]) -> torch.Tensor:
        """(2H - 1, 2W - 1, 2): the offsets (di, dj) by row and column of the kernel layout, as float."""
        weight = self.rpe.output.weight
        rows, columns = (relative_lags(size, causal=False, device=weight.device, dtype=weight.dtype) for size in grid)
        return torch.stack(torch.meshgrid(rows, columns, indexing="ij"), dim=-1)

    def kernel(self, grid: tuple[int, int]) -> torch.Tensor:
        """Explicit t[di, dj] by offset, (2H - 1, 2W - 1, dim), computed plainly (tests and plots)."""
        offsets = self.offsets(grid)
        return self.decay(offsets.abs().sum(-1))[..., None] * self.rpe(offsets)

    def spectrum(self, grid: tuple[int, int], fft_shape: tuple[int, int], channels: slice = slice(None)) -> torch.Tensor:
        """rfft2 of the kernel of ``channels`` at ``fft_shape``, (channels, N_H, N_W/2 + 1), through the factored form."""
        offsets = self.offsets(grid)
        decay = self.decay(offsets.abs().sum(-1))[..., None]
        basis = toeplitz2d_spectrum(torch.cat([decay * self.rpe.features(offsets), decay], dim=-1), fft_shape)
        readout = torch.cat([self.rpe.output.weight.t(), self.rpe.output.bias[None]], dim=0)[:, channels]
        return complex_readout(basis.flatten(1), readout).unflatten(1, basis.shape[1:])

    def mix_grid(self, x: torch.Tensor, grid: tuple[int, int], channels: slice) -> torch.Tensor:
        fft_shape = fft_grid(grid)
        key = (grid, channels.start, channels.stop)
        spectrum = self._cache.get(key, lambda: self.spectrum(grid, fft_shape, channels), weights=self)
        return spectral_matvec2d(x, spectrum, grid, fft_shape)

    def operator_matrix(self, grid: tuple[int, int], channels: slice = slice(None)) -> torch.Tensor:
        return naive_toeplitz2d_matrix(self.kernel(grid)[..., channels])


def axis_mixers() -> list[str]:
    """The registered mixers ``separable2d`` can run along an axis: linear per channel, over a
    sequence, bidirectional (the operator is the Kronecker product of two such matrices)."""
    return [name for name in list_mixers() if _mixes_an_axis(mixer_class(name))]


def _mixes_an_axis(cls) -> bool:
    return cls.channelwise_linear and cls.token_axes == 1 and False in cls.causal_modes


def axis_matrix(mixer: Mixer, n: int, channels: slice) -> torch.Tensor:
    """The (channels, n, n) matrix of a linear 1-D mixer: its responses to the n unit impulses."""
    parameter = next(mixer.parameters())
    impulses = torch.eye(n, dtype=parameter.dtype, device=parameter.device)
    responses = mixer(impulses[:, :, None].expand(n, n, mixer.dim))  # responses[j, i, c] = T_c[i, j]
    return responses.permute(2, 1, 0)[channels]


@register_mixer("separable2d")
class Separable2d(GridMixer):
    """A 1-D Toeplitz mixer along the rows, then one along the columns (name ``separable2d``)."""

    options_type = GridOptions

    @classmethod
    def parts(cls) -> list[Part]:
        """``axis_mixer``: the 1-D mixer run along every row, then (a second one, the same options) along every column."""
        return [Part("axis_mixer", "tno", axis_mixers)]

    def __init__(self, dim: int, causal: bool = False, options: GridOptions | None = None):
        super().__init__(dim, causal, options)
        self.axis_mixer = self.options.parts["axis_mixer"].name
        self.rows = self.build_part("axis_mixer", dim, False)  # mixes each row: W tokens
        self.columns = self.build_part("axis_mixer", dim, False)  # mixes each column: H tokens

    def mix_grid(self, x: torch.Tensor, grid: tuple[int, int], channels: slice) -> torch.Tensor:
        if channels != slice(None):
            raise ValueError("separable2d mixes every channel at once (it has no channel_slices)")
        (rows, columns), batch, dim = grid, x.shape[0], self.dim
        y = self.rows(x.reshape(batch * rows, columns, dim)).reshape(batch, rows, columns, dim)
        y = self.columns(y.transpose(1, 2).reshape(batch * columns, rows, dim)).reshape(batch, columns, rows, dim)
        return y.transpose(1, 2).reshape(batch, rows * columns, dim)

    def operator_matrix(self, grid: tuple[int, int], channels: slice = slice(None)) -> torch.Tensor:
        """C kron R per channel, from the axis mixers' responses to unit impulses."""
        (rows, columns), column_matrix = grid, axis_matrix(self.columns, grid[0], channels)
        row_matrix = axis_matrix(self.rows, columns, channels)
        return torch.einsum("cik,cjl->cijkl", column_matrix, row_matrix).reshape(-1, rows * columns, rows * columns)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, axis_mixer={self.axis_mixer}"
