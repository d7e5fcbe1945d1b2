"""Pictures of what Toeplitz mixers are and what trained ones learned.

- ``plot_fd_responses``: frequency and impulse responses of randomly initialised FD-TNO RPEs for
  each activation; smoother activations decay faster in time (SKI-TNN and FD-TNN paper, §4.2,
  Theorems 2-4, Figs 4-6).
- ``plot_operators``: heatmaps of every mixer of a model that exposes ``operator_matrices(n)``
  (TNO: T; SKI-TNO: its band, its smooth or low-rank part and their sum; FD-TNO: T; MEGA's damped
  EMA: its kernel as T), on a symmetric-log colour scale so that the off-diagonal structure, often
  orders of magnitude below the diagonal, stays visible; plus FD responses when the model has any.
- ``plot_distil_sweep``: a ``tokenmix distil`` sweep, kernel errors and validation loss against the order.
- ``plot_listops_distributions``: lengths, nodes by depth and argument counts of generated ListOps
  trees against the generator's rules (the length bounds, operators drawn with probability 0.25
  below max_depth, argument counts uniform).
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from matplotlib.colors import SymLogNorm  # noqa: E402

from ..data.listops import ListOpsOptions, distinct_expressions, expression_shape  # noqa: E402
from ..io.files import save_figure  # noqa: E402
from ..mixers.fd_tno import rfft_frequencies  # noqa: E402
from ..mixers.registry import build_mixer  # noqa: E402
from ..ops.fft import fast_fft_size  # noqa: E402

DYNAMIC_RANGE = 1e-4  # the symmetric-log scale is linear below this fraction of the largest |value|


def _draw_fd(axes_row, mixer, n: int, label: str, channels: int) -> None:
    """Re G(w) and |t_k| of the first ``channels`` channels of an FD-TNO."""
    fft_size = fast_fft_size(2 * n)
    omega = rfft_frequencies(fft_size).numpy()
    response = mixer.response(fft_size)[:channels].real.numpy()
    taps = mixer.kernel(n)[-n:].abs()[:, :channels].clamp_min(1e-12).numpy()
    for c in range(channels):
        axes_row[0].plot(omega, response[c], lw=0.8, label=f"channel {c}")
        axes_row[1].semilogy(taps[:, c], lw=0.8, label=f"channel {c}")
    axes_row[0].set(title=f"{label}: frequency response", xlabel="frequency w (radians per token)", ylabel="Re G(w)")
    axes_row[1].set(title=f"{label}: impulse response", xlabel="lag k (tokens)", ylabel="|t_k|", ylim=(1e-9, None))
    for axis in axes_row:
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=7)


@torch.no_grad()
def plot_fd_responses(path, activations=("gelu", "silu", "relu"), n: int = 512, channels: int = 4, seed: int = 0) -> Path:
    """Random causal FD-TNO RPEs, one row per activation."""
    fig, axes = plt.subplots(len(activations), 2, figsize=(11, 3.2 * len(activations)), squeeze=False, layout="constrained")
    for row, activation in zip(axes, activations, strict=True):
        torch.manual_seed(seed)
        _draw_fd(row, build_mixer("fd_tno", channels, causal=True, activation=activation), n, f"{activation} RPE", channels)
    fig.suptitle(f"Random FD-TNO responses at n = {n}: smoother activations decay faster in time")
    return _save(fig, path)


def toeplitz_mixers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """(name, module) of every mixer of ``model`` with explicit operator matrices; ValueError when none."""
    mixers = [(name, module) for name, module in model.named_modules() if callable(getattr(module, "operator_matrices", None))]
    if not mixers:
        raise ValueError("the model has no Toeplitz mixer (tno, ski_tno, fd_tno, ema) to plot")
    return mixers


def _heatmap(fig, ax, matrix: torch.Tensor, title: str) -> None:
    """The matrix on a symmetric log colour scale; the bar is labelled at 0 and at each decade down from the
    largest |value| to ten times the linear range (a label at its edge would sit on the 0)."""
    values = matrix.float().numpy()
    limit = float(abs(values).max()) or 1.0
    norm = SymLogNorm(linthresh=limit * DYNAMIC_RANGE, vmin=-limit, vmax=limit)
    image = ax.imshow(values, cmap="RdBu_r", norm=norm, interpolation="nearest")
    ax.set(title=title, xlabel="j (input position)", ylabel="i (output position)")
    decades = [limit * 10.0**-k for k in range(round(-math.log10(DYNAMIC_RANGE)))]
    ticks = [-value for value in decades] + [0.0] + decades[::-1]
    bar = fig.colorbar(image, ax=ax, fraction=0.046, label="T[i, j] (symmetric log scale)", ticks=ticks)
    bar.ax.set_yticklabels([f"{tick:.0e}" if tick else "0" for tick in ticks])


@torch.no_grad()
def plot_operators(model: torch.nn.Module, out_dir, n: int = 256, channel: int = 0) -> list[Path]:
    """One heatmap figure per Toeplitz mixer of ``model`` (and FD responses); returns the files."""
    out_dir = Path(out_dir)
    files = []
    for index, (name, mixer) in enumerate(toeplitz_mixers(model)):
        if not 0 <= channel < mixer.dim:
            raise ValueError(f"channel must be in [0, {mixer.dim - 1}] for {name} ({mixer.dim} channels), got {channel}")
        panels = {title: matrices[0] for title, matrices in mixer.operator_matrices(n, slice(channel, channel + 1)).items()}
        fig, axes = plt.subplots(1, len(panels), figsize=(4.8 * len(panels), 4.6), squeeze=False, layout="constrained")
        for ax, (title, matrix) in zip(axes[0], panels.items(), strict=True):
            _heatmap(fig, ax, matrix, title)
        fig.suptitle(f"{name}\n{type(mixer).__name__}, {'causal' if mixer.causal else 'bidirectional'}, channel {channel}, n = {n}")
        files.append(_save(fig, out_dir / f"operator_{index}.png"))
        if callable(getattr(mixer, "response", None)):
            fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), squeeze=False, layout="constrained")
            _draw_fd(axes[0], mixer, n, name, channels=min(4, mixer.dim))
            files.append(_save(fig, out_dir / f"fd_response_{index}.png"))
    return files


def plot_listops_distributions(path, count: int = 2000, seed: int = 0, **options) -> Path:
    """Distributions of ``count`` generated ListOps trees (``options`` as ``ListOpsOptions``, official by default)
    against the generator's rules: lengths within the kept bounds; nodes by depth, with the fraction that
    are operators (drawn with probability 0.25 below max_depth, none at it); argument counts, drawn uniformly."""
    resolved = ListOpsOptions(**options)
    trees = distinct_expressions(count, seed, resolved)
    shapes = [expression_shape(tokens) for tokens, _ in trees]
    levels = range(1, resolved.max_depth + 1)
    leaves, operators = (
        [sum(getattr(shape, kind)[d - 1] for shape in shapes if shape.depth >= d) for d in levels] for kind in ("leaves", "operators")
    )
    arities = [arity for shape in shapes for arity in shape.arities]
    depths = Counter(shape.depth for shape in shapes)
    fig, (length_ax, depth_ax, arity_ax) = plt.subplots(1, 3, figsize=(16, 4.2), layout="constrained")
    length_ax.hist([len(tokens) for tokens, _ in trees], bins=50, color="tab:blue")
    for bound in (resolved.min_length, resolved.max_length):
        length_ax.axvline(bound, color="tab:red", ls="--", lw=1)
    length_ax.set(
        title=f"length (kept: {resolved.min_length} < length < {resolved.max_length}, red)",
        xlabel="tokens without parentheses",
        ylabel="trees",
    )
    depth_ax.bar(levels, [(a + b) / count for a, b in zip(leaves, operators, strict=True)], color="tab:blue")
    depth_ax.set(xlabel="depth (the root at 1)", ylabel="nodes per tree", yscale="log", xticks=list(levels))
    depth_ax.set_title("tree depths: " + ", ".join(f"{depth}: {trees_at:,}" for depth, trees_at in sorted(depths.items())), fontsize=10)
    share = depth_ax.twinx()
    share.plot(
        levels, [b / max(a + b, 1) for a, b in zip(leaves, operators, strict=True)], "o-", color="tab:orange", label="operator fraction"
    )
    share.plot(levels, [0.25] * (resolved.max_depth - 1) + [0.0], "--", color="tab:red", label="drawn: 0.25, none at max_depth")
    share.set(ylabel="fraction of nodes that are operators", ylim=(0, 1))
    share.legend(fontsize=8, loc="center right")
    arity_ax.hist(arities, bins=[a - 0.5 for a in range(2, resolved.max_args + 2)], density=True, color="tab:blue", rwidth=0.8)
    arity_ax.axhline(1 / (resolved.max_args - 1), color="tab:red", ls="--", lw=1, label=f"drawn: uniform on 2..{resolved.max_args}")
    arity_ax.set(title=f"arguments per operator ({len(arities):,} operators)", xlabel="arguments", ylabel="fraction")
    arity_ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(f"ListOps generator: {count:,} distinct trees, seed {seed}, max_depth {resolved.max_depth}, max_args {resolved.max_args}")
    return _save(fig, path)


def plot_distil_sweep(rows: list[dict], max_loss_increase: float | None, path, title: str) -> Path:
    """A ``tokenmix distil`` sweep: the kernels' largest errors and Hankel bound against the order (left), the
    validation loss's increase over the exact model's against the order, beside the budget (right)."""
    orders = [row["order"] for row in rows]
    fig, (error_ax, loss_ax) = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
    for key, label in (("relative_l2", "kernel relative l2 error"), ("relative_linf", "kernel relative l-inf error"),
                       ("bound_vs_l1", "Hankel bound 2 sum sigma_tail / l1 norm")):  # fmt: skip
        error_ax.loglog(orders, [max(row[key], 1e-16) for row in rows], "o-", label=label)
    error_ax.set(title="largest over layers and channels", xlabel="order N (complex modes per channel)", ylabel="relative to the kernel")
    increase = [100 * row["loss_increase"] for row in rows]
    loss_ax.semilogx(orders, increase, "o-", label="distilled model")
    if max_loss_increase is not None:
        loss_ax.axhline(100 * max_loss_increase, color="C3", ls="--", label=f"budget {100 * max_loss_increase:g}%")
    loss_ax.axhline(0.0, color="grey", lw=0.8)
    loss_ax.set(title="validation loss against the exact model's", xlabel="order N (complex modes per channel)", ylabel="loss increase (%)")
    for axis in (error_ax, loss_ax):
        axis.set_xscale("log", base=2)
        axis.set_xticks(orders, [str(order) for order in orders])
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=8)
    fig.suptitle(title)
    return _save(fig, path)


def _save(fig, path) -> Path:
    """Write ``fig`` atomically to ``path`` (its format from the suffix) and close it."""
    try:
        return save_figure(fig, path)
    finally:
        plt.close(fig)
