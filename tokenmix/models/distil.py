"""Constant-memory decoding for Toeplitz models: each causal Toeplitz mixer replaced by a diagonal state
space (``ssm``) fitted to its kernel.

A causal Toeplitz mixer (``tno``, ``fd_tno``, ``ski_tno``: those that stream by their taps) decodes
exactly with a state that holds its whole input history. ``distil`` evaluates each one's kernel over
``horizon`` lags (``fd_tno``: the operator at that length), keeps the first ``window`` lags as exact
taps and fits the rest with ``order`` modes by balanced truncation (``ops/balanced.py``), then builds
the same model with ``ssm`` mixers in their place and every other weight unchanged. Per layer it
reports the kernel's relative l2 and l-infinity errors over the horizon and the Hankel bound for
the order, 2 sum_(i > order) sigma_i, relative to the kernel's l1 and l2 norms (LaughingHyena,
Massaroli et al. 2023, arXiv 2310.18780, distils Hyena's filters the same way).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..io.progress import progress_bar
from ..mixers.registry import mixer_class
from ..ops.balanced import hankel_spectrum
from .config import ModelConfig
from .model import SequenceModel

CHANNEL_BLOCK = 32  # channels fitted at once: each holds three (horizon, horizon) float64 matrices


def distillable(mixer) -> bool:
    """A mixer ``distil`` replaces: causal, streamed by its Toeplitz taps."""
    return getattr(mixer, "toeplitz_streaming", False) and mixer.causal


def distilled_options(tree: dict, order: int, window: int = 0) -> dict:
    """The options tree with every Toeplitz mixer's options replaced by the ``ssm``'s."""
    replaced = {}
    for key, value in tree.items():
        if isinstance(value, dict) and "name" in value and getattr(mixer_class(value["name"]), "toeplitz_streaming", False):
            replaced[key] = {"name": "ssm", "order": order, "window": window}
        elif isinstance(value, dict):
            replaced[key] = distilled_options(value, order, window)
        else:
            replaced[key] = value
    return replaced


def check_distil(model: SequenceModel, order: int, window: int, horizon: int) -> None:
    """ValueError naming the argument unless ``model`` has causal Toeplitz mixers and the sizes fit together."""
    for name, value, minimum in (("order", order, 1), ("window", window, 0), ("horizon", horizon, 2)):
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if model.config.task != "lm":
        raise ValueError(f"distil needs a causal language model (task 'lm'); model {model.config.name!r} has task={model.config.task!r}")
    if not any(distillable(module) for module in model.modules()):
        raise ValueError(f"model {model.config.name!r} has no causal Toeplitz mixer (tno, fd_tno, ski_tno) to distil")
    if order > horizon - window:
        raise ValueError(
            f"order={order} must be at most the horizon's {horizon - window} lags past the window (horizon={horizon}, window={window})"
        )


def fit_kernel(kernel: torch.Tensor, orders: Sequence[int], window: int) -> list[tuple[dict, dict]]:
    """For each order: (the ``ssm``'s modes and taps, the fit's errors per channel), for kernels (horizon, channels).
    Each block of channels' Hankel matrices is decomposed once for every order, on the CPU in float64
    (the least squares use LAPACK's gelsd, which CUDA lacks; the matrices are small)."""
    kernel = kernel.detach().cpu().double()
    fits = {order: [] for order in orders}
    for start in range(0, kernel.shape[1], CHANNEL_BLOCK):  # one block's (L, L) matrices held at a time
        spectrum = hankel_spectrum(kernel[window:, start : start + CHANNEL_BLOCK])
        for order in orders:
            fits[order].append(spectrum.truncate(order))
    return [_fit_order(fits[order], kernel, window) for order in orders]


def _fit_order(fits: list, kernel: torch.Tensor, window: int) -> tuple[dict, dict]:
    poles, residues = (torch.cat([getattr(fit, name) for fit in fits]) for name in ("poles", "residues"))
    bound = torch.cat([fit.bound for fit in fits])
    fitted = torch.cat([kernel[:window], torch.cat([fit.kernel(kernel.shape[0] - window) for fit in fits], dim=1)])
    error = fitted - kernel
    errors = {
        "relative_l2": error.norm(dim=0) / kernel.norm(dim=0).clamp_min(1e-300),
        "relative_linf": error.abs().amax(dim=0) / kernel.abs().amax(dim=0).clamp_min(1e-300),
        "bound_vs_l2": bound / kernel.norm(dim=0).clamp_min(1e-300),
        "bound_vs_l1": bound / kernel.abs().sum(dim=0).clamp_min(1e-300),
    }
    return {"poles": poles, "residues": residues, "taps": kernel[:window].t()}, errors


@dataclass
class LayerFit:
    """One replaced mixer's fitted modes (``Ssm.set_modes`` arguments) and its report."""

    path: str
    modes: dict
    report: dict


def fit_orders(
    model: SequenceModel, orders: Sequence[int], window: int = 0, horizon: int = 1024, progress: bool = False
) -> dict[int, list[LayerFit]]:
    """Each order's fits of every causal Toeplitz mixer of ``model`` over ``horizon`` lags after ``window``
    exact taps (module docstring); each mixer's kernel evaluated and decomposed once for all orders."""
    for order in orders:
        check_distil(model, order, window, horizon)
    fits = {order: [] for order in orders}
    replaced = [(path, module) for path, module in model.named_modules() if distillable(module)]
    for path, module in progress_bar(replaced, desc="distil", unit="mixer", disable=not progress):
        with torch.no_grad():
            kernel = module.stream_taps(horizon, horizon)
        for order, (modes, errors) in zip(orders, fit_kernel(kernel, orders, window), strict=True):
            report = {"mixer": path, **{name: float(value.max()) for name, value in errors.items()}}
            fits[order].append(LayerFit(path, modes, {**report, "median_relative_l2": float(errors["relative_l2"].median())}))
    return fits


def distilled_model(model: SequenceModel, order: int, window: int, fits: list[LayerFit]) -> SequenceModel:
    """``model`` with each fitted mixer replaced by an ``ssm`` of ``order`` modes holding its fit; every other weight kept."""
    options = distilled_options(model.config.options.as_dict(), order, window)
    config = ModelConfig.from_dict({**model.config.to_dict(), "options": options})
    parameter = next(model.parameters())
    distilled = SequenceModel(config).to(parameter.device, parameter.dtype).eval()
    paths = tuple(f"{fit.path}." for fit in fits)
    kept = {key: value for key, value in model.state_dict().items() if not key.startswith(paths)}
    missing, unexpected = distilled.load_state_dict(kept, strict=False)
    if unexpected or not all(key.startswith(paths) for key in missing):
        raise RuntimeError(f"distil: weights that do not carry over: missing {missing}, unexpected {unexpected}")  # pragma: no cover
    for fit in fits:
        distilled.get_submodule(fit.path).set_modes(**fit.modes)
    return distilled


def distil(
    model: SequenceModel, order: int, window: int = 0, horizon: int = 1024, progress: bool = False
) -> tuple[SequenceModel, list[dict]]:
    """(the distilled model, one report per replaced mixer): every causal Toeplitz mixer of ``model``
    fitted over ``horizon`` lags with ``order`` modes after ``window`` exact taps (module docstring)."""
    fits = fit_orders(model, [order], window, horizon, progress)[order]
    return distilled_model(model, order, window, fits), [fit.report for fit in fits]


SWEEP_ORDERS = (4, 8, 16, 32, 64, 128)  # the orders ``tokenmix distil --max-loss-increase`` tries unless told


def sweep_orders(
    model: SequenceModel,
    orders: Sequence[int],
    loss_of: Callable[[SequenceModel], float],
    window: int = 0,
    horizon: int = 1024,
    progress: bool = False,
) -> tuple[list[dict], dict[int, list[LayerFit]]]:
    """(one row per order: the loss ``loss_of`` gives the distilled model, its relative increase over the exact
    model's, the largest kernel errors and Hankel bound over the layers, the state bytes per sequence; the fits)."""
    fits = fit_orders(model, orders, window, horizon, progress)
    exact = loss_of(model)
    rows = []
    for order in progress_bar(orders, desc="evaluate", unit="order", disable=not progress):
        distilled = distilled_model(model, order, window, fits[order])
        loss, reports = loss_of(distilled), [fit.report for fit in fits[order]]
        errors = {name: max(report[name] for report in reports) for name in ("relative_l2", "relative_linf", "bound_vs_l1", "bound_vs_l2")}
        rows.append(
            {"order": order, "loss": loss, "exact_loss": exact, "loss_increase": loss / exact - 1.0, **errors,
             "state_bytes": distilled.init_state(1).nbytes()}
        )  # fmt: skip
    return rows, fits


def recommended_order(rows: list[dict], max_loss_increase: float) -> int:
    """The smallest order of a sweep whose loss exceeds the exact model's by at most ``max_loss_increase``
    (a fraction); ValueError naming the closest when none does."""
    within = [row["order"] for row in rows if row["loss_increase"] <= max_loss_increase]
    if within:
        return min(within)
    best = min(rows, key=lambda row: row["loss_increase"])
    raise ValueError(
        f"--max-loss-increase {max_loss_increase:.4%}: no order of {[row['order'] for row in rows]} keeps the loss within it; the "
        f"closest, order {best['order']}, adds {best['loss_increase']:.4%}: give a larger budget, higher orders or a --window"
    )
