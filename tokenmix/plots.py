"""Pictures of what Toeplitz mixers are (paper 000 §4.2, Figs 4-6) and what trained ones learned.

- ``plot_fd_responses``: frequency and impulse responses of randomly initialised FD RPEs for
  each activation; smoother activations decay faster in time (Theorems 2-4).
- ``plot_operators``: heatmaps of every Toeplitz mixer of a model (TNO: T; SKI-TNO: its band,
  its low-rank W A W^T and their sum; FD-TNO: T; MEGA's damped EMA: its kernel as T), plus FD
  responses when the model has any.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from .mixers.ema import Ema  # noqa: E402
from .mixers.fd_tno import FdTno, rfft_frequencies  # noqa: E402
from .mixers.registry import build_mixer  # noqa: E402
from .mixers.ski_tno import SkiTno  # noqa: E402
from .mixers.tno import Tno  # noqa: E402
from .ops.fft import fast_fft_size  # noqa: E402
from .ops.toeplitz import naive_toeplitz_matrix  # noqa: E402

TOEPLITZ_MIXERS = (Tno, SkiTno, FdTno, Ema)


def _impulse_magnitude(mixer: FdTno, n: int) -> torch.Tensor:
    """|t_k| for k = 0 ... n - 1 (causal taps, or the non-negative lags), (n, dim)."""
    return mixer.kernel(n)[-n:].abs()


def _draw_fd(axes_row, mixer: FdTno, n: int, label: str, channels: int) -> None:
    fft_size = fast_fft_size(2 * n)
    omega = rfft_frequencies(fft_size).numpy()
    response = mixer.response(fft_size)[:channels].real.numpy()
    taps = _impulse_magnitude(mixer, n)[:, :channels].clamp_min(1e-12).numpy()
    for c in range(channels):
        axes_row[0].plot(omega, response[c], lw=0.8)
        axes_row[1].semilogy(taps[:, c], lw=0.8)
    axes_row[0].set(title=f"{label}: Re G(w)", xlabel="w")
    axes_row[1].set(title=f"{label}: |impulse response|", xlabel="lag", ylim=(1e-9, None))


@torch.no_grad()
def plot_fd_responses(path, activations=("gelu", "silu", "relu"), n: int = 512, channels: int = 4, seed: int = 0) -> Path:
    """Random causal FD-TNO RPEs, one row per activation (paper 000, Figs 4-6)."""
    fig, axes = plt.subplots(len(activations), 2, figsize=(10, 3 * len(activations)), squeeze=False)
    for row, activation in zip(axes, activations, strict=True):
        torch.manual_seed(seed)
        _draw_fd(row, build_mixer("fd_tno", channels, causal=True, activation=activation), n, activation, channels)
    return _save(fig, path)


def operator_panels(mixer, n: int, channel: int = 0) -> dict[str, torch.Tensor]:
    """Named (n, n) matrices of one channel of a Toeplitz mixer."""
    if isinstance(mixer, SkiTno):
        sparse, low_rank = mixer.sparse_matrix(n)[channel], mixer.low_rank_matrix(n)[channel]
        return {"band (sparse)": sparse, "W A W^T (low rank)": low_rank, "sum": sparse + low_rank}
    return {"T": naive_toeplitz_matrix(mixer.kernel(n), n, mixer.causal)[channel]}


@torch.no_grad()
def plot_operators(model: torch.nn.Module, out_dir, n: int = 256, channel: int = 0) -> list[Path]:
    """One heatmap figure per Toeplitz mixer of ``model`` (and FD responses); returns the files."""
    out_dir = Path(out_dir)
    mixers = [(name, m) for name, m in model.named_modules() if isinstance(m, TOEPLITZ_MIXERS)]
    if not mixers:
        raise ValueError("the model has no Toeplitz mixer (tno, ski_tno, fd_tno, ema) to plot")
    files = []
    for index, (name, mixer) in enumerate(mixers):
        panels = operator_panels(mixer, n, channel)
        fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4), squeeze=False)
        for ax, (title, matrix) in zip(axes[0], panels.items(), strict=True):
            limit = float(matrix.abs().max()) or 1.0
            image = ax.imshow(matrix.float().numpy(), cmap="RdBu_r", vmin=-limit, vmax=limit)
            ax.set(title=title, xlabel="j (input)", ylabel="i (output)")
            fig.colorbar(image, ax=ax, fraction=0.046)
        fig.suptitle(f"{name} ({type(mixer).__name__}, channel {channel}, n={n})")
        files.append(_save(fig, out_dir / f"operator_{index}.png"))
        if isinstance(mixer, FdTno):
            fig, axes = plt.subplots(1, 2, figsize=(10, 3), squeeze=False)
            _draw_fd(axes[0], mixer, n, name, channels=4)
            files.append(_save(fig, out_dir / f"fd_response_{index}.png"))
    return files


def _save(fig, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
