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

import torch

from ..mixers.registry import mixer_class
from ..ops.balanced import balanced_modes
from ..progress import progress_bar
from .config import ModelConfig
from .model import SequenceModel

CHANNEL_BLOCK = 32  # channels fitted at once: each holds three (horizon, horizon) float64 matrices


def distillable(mixer) -> bool:
    """A mixer ``distil`` replaces: causal, streamed by its Toeplitz taps."""
    return getattr(mixer, "toeplitz_streaming", False) and mixer.causal


def _replaced_options(tree: dict, order: int, window: int) -> tuple[dict, int]:
    """The options tree with every Toeplitz mixer's options replaced by the ``ssm``'s, and how many were."""
    replaced, count = {}, 0
    for key, value in tree.items():
        if isinstance(value, dict) and "name" in value and getattr(mixer_class(value["name"]), "toeplitz_streaming", False):
            replaced[key], count = {"name": "ssm", "order": order, "window": window}, count + 1
        elif isinstance(value, dict):
            replaced[key], inner = _replaced_options(value, order, window)
            count += inner
        else:
            replaced[key] = value
    return replaced, count


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


def fit_kernel(kernel: torch.Tensor, order: int, window: int) -> tuple[dict, dict]:
    """(the ``ssm``'s modes and taps, the fit's errors per channel) for kernels (horizon, channels)."""
    kernel = kernel.double()
    fits = [balanced_modes(kernel[window:, start : start + CHANNEL_BLOCK], order) for start in range(0, kernel.shape[1], CHANNEL_BLOCK)]
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


def distil(
    model: SequenceModel, order: int, window: int = 0, horizon: int = 1024, progress: bool = False
) -> tuple[SequenceModel, list[dict]]:
    """(the distilled model, one report per replaced mixer): every causal Toeplitz mixer of ``model``
    fitted over ``horizon`` lags with ``order`` modes after ``window`` exact taps (module docstring)."""
    check_distil(model, order, window, horizon)
    options, _ = _replaced_options(model.config.options, order, window)
    config = ModelConfig.from_dict({**model.config.to_dict(), "options": options})
    parameter = next(model.parameters())
    distilled = SequenceModel(config).to(parameter.device, parameter.dtype).eval()
    replaced = [(path, module) for path, module in model.named_modules() if distillable(module)]
    kept = {key: value for key, value in model.state_dict().items() if not any(key.startswith(f"{path}.") for path, _ in replaced)}
    missing, unexpected = distilled.load_state_dict(kept, strict=False)
    if unexpected or any(not any(key.startswith(f"{path}.") for path, _ in replaced) for key in missing):
        raise RuntimeError(f"distil: weights that do not carry over: missing {missing}, unexpected {unexpected}")  # pragma: no cover
    reports = []
    for path, module in progress_bar(replaced, desc="distil", unit="mixer", disable=not progress):
        with torch.no_grad():
            kernel = module.stream_taps(horizon, horizon)
        modes, errors = fit_kernel(kernel, order, window)
        distilled.get_submodule(path).set_modes(**modes)
        reports.append(
            {
                "mixer": path,
                **{name: float(value.max()) for name, value in errors.items()},
                "median_relative_l2": float(errors["relative_l2"].median()),
            }
        )
    return distilled, reports
