"""SKI-TNO: sparse plus low-rank Toeplitz operator (SKI-TNN, Moreno et al. 2023, §3.2, Algorithm 1).

Per channel y = T_sparse x + W A W^T x:
- T_sparse: a band of ``filter_size`` diagonals (made odd, centred on lag 0), a depthwise conv;
- W A W^T: ``rank`` inducing points on [0, n - 1], W their interpolation weights (``interpolation``
  linear or cubic), A_ij = k(p_i - p_j) with k(t) = RPE(x(t)), x(t) = sign(t) decay^|t| the inverse
  time warp and RPE a learned piecewise-linear function on [-1, 1] with RPE(0) = 0 (``knots`` per
  side). Every lag maps into [-1, 1], so one module serves any length. With ``max_spacing`` the
  grid keeps its resolution at longer lengths: r = max(rank, ceil((n - 1) / max_spacing) + 1), so
  the operator a model was trained with is not coarsened when it extrapolates (W A W^T then costs
  O(n + r log r) with r growing in n).
W A W^T x runs densely (matmuls, the paper's practical choice) or sparsely (linear: native
upsampling kernels; cubic: gather/scatter), O(n + r log r) per channel; ``path="auto"`` picks by
length and interpolation, from the measurements in docs/results/speed.md ("Choosing the SKI path").

Knot values and taps are stored divided by ``gain`` (default 8) and multiplied back: Adam moves a
parameter by about lr per step, and each of these is a kernel value on its own (a TNN kernel value
is a 64-wide dot product), so the gain is their step-size multiplier; the initial operator does not
depend on it (docs/ski_fd.md has its measured effect on training).

``causal=True`` has no low-rank shortcut (Moreno et al. 2023, Appendix B): the kernel
t_k = RPE(x(k)) + f_k at every lag k = 0 ... n - 1 (f the band's taps at lags 0 ... m - 1) is
applied as a causal Toeplitz product by FFT, O(n log n). It is linear in the knot values and taps,
so its spectrum is a fixed basis spectrum (cached per length) times the parameters: one matmul.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..fields import Choice, Integer, Number, setting
from ..ops.band import band_matvec, naive_band_matrix
from ..ops.fft import convolution_fft_size
from ..ops.interpolation import DEGREES, check_interpolation
from ..ops.ski import (
    dense_interpolation,
    inducing_lags,
    inverse_time_warp,
    naive_ski_matrix,
    ski_dense_matvec,
    ski_linear_matvec,
    ski_sparse_matvec,
    ski_weights,
    toeplitz_blocks,
)
from ..ops.toeplitz import naive_toeplitz_matrix, toeplitz_spectrum
from ..options import Options
from .base import PADDING_SIDES, ChannelSliced, Mixer
from .cache import Cache
from .registry import register_mixer
from .rpe import PiecewiseLinearEncoder
from .tno import cached_or_factored_matvec, relative_lags
from .toeplitz_stream import ToeplitzStreaming

PATHS = ("auto", "dense", "sparse")
# path="auto": the sparse path from this length on, per interpolation (None: never). Measured with
# `tokenmix bench --mixers ski_tno -o path=... -o interpolation=...` at lengths 256-16384 (docs/results/speed.md):
# linear upsampling beat the matmuls at every length, the cubic gather/scatter at none.
SPARSE_FROM_LENGTH = {"linear": 1, "cubic": None}


@dataclass
class SkiTnoOptions(Options):
    filter_size: int = setting(32, Integer(1), "band of the sparse part (made odd and centred: lags -16 ... 16)")
    rank: int = setting(64, Integer(2), "inducing points r of the low-rank part W A W^T")
    decay: float = setting(
        0.99, Number(0, 1, open_minimum=True, open_maximum=True), "base of the inverse time warp x(t) = sign(t) decay^abs(t)"
    )
    knots: int = setting(32, Integer(1), "knots per side of the piecewise-linear RPE on [-1, 1] (RPE(0) = 0)")
    interpolation: str = setting("linear", Choice(sorted(DEGREES)), "W's interpolation: linear (2 non-zeros per row) or cubic (4)")
    path: str = setting("auto", Choice(PATHS), "W A W^T x by dense matmuls or sparse O(n) kernels; auto picks by length")
    gain: float = setting(8.0, Number(0, open_minimum=True), "step-size multiplier of the knot values and band taps (stored divided by it)")
    max_spacing: float | None = setting(
        None, Number(1, optional=True), "largest gap between inducing points in tokens: r = max(rank, ceil((n - 1) / max_spacing) + 1)"
    )


@register_mixer("ski_tno")
class SkiTno(ToeplitzStreaming, ChannelSliced, Mixer):
    """Sparse + low-rank Toeplitz neural operator (name ``ski_tno``)."""

    options_type = SkiTnoOptions
    no_weight_decay = ("band",)
    inner_precision = "float32"  # the time warp decay^|t| and the interpolation weights; FFT products

    def __init__(self, dim: int, causal: bool = False, options: SkiTnoOptions | None = None):
        super().__init__(dim, causal, options)
        o = self.options
        self.rank, self.decay, self.path, self.interpolation = o.rank, o.decay, o.path, o.interpolation
        self.degree = check_interpolation(o.interpolation)
        self.filter_size = o.filter_size | 1  # odd, so a centred band covers lags -(m-1)/2 ... (m-1)/2
        self.min_lag = 0 if causal else -(self.filter_size // 2)
        self.gain, self.max_spacing = o.gain, o.max_spacing
        self.rpe = PiecewiseLinearEncoder(dim, o.knots, self.gain)
        bound = self.filter_size**-0.5 / self.gain  # taps = gain * parameters, uniform in +-1/sqrt(m) at init
        self.band = nn.Parameter(torch.empty(dim, self.filter_size).uniform_(-bound, bound))
        self._by_length = Cache(size=24)  # parameter-free: interpolation weights and basis spectra by length
        self._cache = Cache()

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, filter_size={self.filter_size}, rank={self.rank}, decay={self.decay}, "
            f"interpolation={self.interpolation}, path={self.path}, max_spacing={self.max_spacing}"
        )

    def _for_length(self, build, n: int, device, dtype: torch.dtype):
        """``build(n, device, dtype)`` (parameter-free), kept per length, device and dtype."""
        return self._by_length.get((build.__name__, n, str(device), dtype), lambda: build(n, device, dtype))

    def _sparse_weights(self, n: int, device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        index, weight = ski_weights(n, self.inducing_count(n), self.degree, device)
        return index, weight.to(dtype)

    def _dense_weights(self, n: int, device, dtype: torch.dtype) -> torch.Tensor:
        return dense_interpolation(n, self.inducing_count(n), self.degree, device).to(dtype)

    def inducing_count(self, n: int) -> int:
        """Inducing points asked for at length n: ``rank``, or more when ``max_spacing`` needs them."""
        if self.max_spacing is None:
            return self.rank
        return max(self.rank, math.ceil((n - 1) / self.max_spacing) + 1)

    @property
    def padding_invariant_sides(self) -> tuple[str, ...]:
        """Causal: both (t_k depends on the lag only). Bidirectional: none (the inducing grid spans the length)."""
        return PADDING_SIDES if self.causal else ()

    @property
    def taps(self) -> torch.Tensor:
        """The band's taps f by lag, (dim, filter_size)."""
        return self.band * self.gain

    def uses_sparse_path(self, n: int) -> bool:
        threshold = SPARSE_FROM_LENGTH[self.interpolation]
        return self.path == "sparse" or (self.path == "auto" and threshold is not None and n >= threshold)

    def smooth_kernel(self, lags: torch.Tensor, channels: slice = slice(None)) -> torch.Tensor:
        """k(t) = RPE(x(t)) at the given (float) lags, (P, channels)."""
        return self.rpe.basis(inverse_time_warp(lags.to(torch.float64), self.decay)) @ self.rpe.values()[:, channels]

    def inducing_kernel(self, n: int, channels: slice = slice(None)) -> torch.Tensor:
        """A_ij = k(p_i - p_j) by lag i - j = -(r - 1) ... r - 1, (2r - 1, channels)."""
        return self.smooth_kernel(inducing_lags(n, self.inducing_count(n), self.band.device), channels)

    # -- causal: kernel at every lag, by FFT -------------------------------------------------------
    def _causal_basis(self, n: int, device) -> torch.Tensor:
        """(n, 2 knots + 1 + m): hat functions at x(k) and one-hot lag columns for the taps."""
        lags = relative_lags(n, causal=True, device=device)
        hats = self.rpe.basis(inverse_time_warp(lags.to(torch.float64), self.decay))
        one_hot = torch.eye(n, self.filter_size, device=device)
        return torch.cat([hats, one_hot], dim=1)

    def _causal_basis_spectrum(self, n: int, device, dtype: torch.dtype) -> torch.Tensor:
        return toeplitz_spectrum(self._causal_basis(n, device).to(dtype), n, causal=True, fft_size=convolution_fft_size(2 * n))

    def _causal_values(self) -> torch.Tensor:
        return torch.cat([self.rpe.values(), self.taps.t()], dim=0)

    def kernel(self, n: int) -> torch.Tensor:
        """Causal kernel t_k, k = 0 ... n - 1, (n, dim)."""
        if not self.causal:
            raise ValueError("kernel(n) is the causal kernel; a bidirectional ski_tno is W A W^T + band (see matrix)")
        return self._causal_basis(n, self.band.device) @ self._causal_values()

    # -- explicit matrices (tests and plots) ---------------------------------------------------------
    def sparse_matrix(self, n: int, channels: slice = slice(None)) -> torch.Tensor:
        """The band part, (channels, n, n)."""
        return naive_band_matrix(self.taps[channels], n, self.min_lag)

    def low_rank_matrix(self, n: int, channels: slice = slice(None)) -> torch.Tensor:
        """W A W^T (bidirectional) or the causal smooth Toeplitz part, (channels, n, n)."""
        if self.causal:
            return naive_toeplitz_matrix(self.smooth_kernel(relative_lags(n, True, self.band.device))[:, channels], n, causal=True)
        blocks = toeplitz_blocks(self.inducing_kernel(n)[:, channels])
        return naive_ski_matrix(self._for_length(self._dense_weights, n, self.band.device, self.band.dtype), blocks)

    def matrix(self, n: int) -> torch.Tensor:
        return self.sparse_matrix(n) + self.low_rank_matrix(n)

    def operator_matrices(self, n: int, channels: slice = slice(None)) -> dict[str, torch.Tensor]:
        """The band, the smooth part (bidirectional: low rank W A W^T) and their sum, each (channels, n, n)."""
        sparse, smooth = self.sparse_matrix(n, channels), self.low_rank_matrix(n, channels)
        smooth_title = "RPE(x(k)) (smooth, causal)" if self.causal else "W A W^T (low rank)"
        return {"band (sparse)": sparse, smooth_title: smooth, "sum": sparse + smooth}

    def mix_channels(self, x: torch.Tensor, mask: torch.Tensor | None, channels: slice) -> torch.Tensor:
        n = x.shape[1]
        if self.causal:
            basis_spectrum = self._for_length(self._causal_basis_spectrum, n, x.device, self.band.dtype)
            return cached_or_factored_matvec(
                self._cache, self, x, n, convolution_fft_size(2 * n), lambda: (basis_spectrum, self._causal_values()), channels
            )
        kernel = self.inducing_kernel(n, channels)
        if self.uses_sparse_path(n) and self.degree == 1 and not torch.compiler.is_compiling():
            low_rank = ski_linear_matvec(x, kernel)  # native upsampling kernels, whose backward torch.compile cannot trace
        elif self.uses_sparse_path(n):
            low_rank = ski_sparse_matvec(x, *self._for_length(self._sparse_weights, n, x.device, self.band.dtype), kernel)
        else:
            low_rank = ski_dense_matvec(x, self._for_length(self._dense_weights, n, x.device, self.band.dtype), kernel)
        return low_rank + band_matvec(x, self.taps[channels], self.min_lag)
