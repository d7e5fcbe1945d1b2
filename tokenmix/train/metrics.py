"""GLUE evaluation metrics as pure functions on tensors (torch only, no sklearn or scipy), and the exact
binomial tail that tests a classifier's accuracy against its majority class.

Every metric takes two tensors of the same shape (flattened before use) and returns a Python float.
Classification metrics take predicted class ids, not logits; ``f1`` and ``matthews_correlation`` are
binary and accept only the values 0 and 1. ``pearson`` and ``spearman`` take float scores (STS-B).
Degenerate cases are defined rather than NaN: see each docstring.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

__all__ = [
    "GLUE_METRICS",
    "GLUE_TASKS",
    "METRICS",
    "accuracy",
    "binomial_tail",
    "f1",
    "glue_metrics",
    "matthews_correlation",
    "pearson",
    "spearman",
]


def _pair(predictions, labels, second: str = "labels") -> tuple[torch.Tensor, torch.Tensor]:
    """Both inputs as flat tensors, after checking that they have the same, non-empty shape."""
    predictions = torch.as_tensor(predictions)
    labels = torch.as_tensor(labels)
    if predictions.shape != labels.shape:
        raise ValueError(
            f"predictions and {second} must have the same shape, got predictions {tuple(predictions.shape)} "
            f"and {second} {tuple(labels.shape)}"
        )
    if predictions.numel() == 0:
        raise ValueError(f"predictions and {second} must not be empty")
    return predictions.reshape(-1), labels.reshape(-1)


def _binary(predictions, labels) -> tuple[torch.Tensor, torch.Tensor]:
    predictions, labels = _pair(predictions, labels)
    for name, values in (("predictions", predictions), ("labels", labels)):
        if not bool(((values == 0) | (values == 1)).all()):
            raise ValueError(f"{name} must contain only the binary classes [0, 1], got {sorted(set(values.tolist()))}")
    return predictions.bool(), labels.bool()


def _confusion(predictions, labels) -> tuple[int, int, int, int]:
    """(TP, TN, FP, FN) for the positive class 1."""
    p, y = _binary(predictions, labels)
    tp = int((p & y).sum())
    tn = int((~p & ~y).sum())
    fp = int((p & ~y).sum())
    fn = int((~p & y).sum())
    return tp, tn, fp, fn


def _scores(predictions, targets) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = _pair(predictions, targets, second="targets")
    x, y = x.to(torch.float64), y.to(torch.float64)
    for name, values in (("predictions", x), ("targets", y)):
        if not bool(torch.isfinite(values).all()):
            raise ValueError(f"{name} must be finite (no NaN or inf)")
    return x, y


def binomial_tail(successes: int, trials: int, probability: float) -> float:
    """P(X >= successes) for X ~ Binomial(trials, probability), exact up to float rounding: the sum over
    k >= successes of C(trials, k) p^k (1 - p)^(trials - k), added in log space (no overflow at any count).
    With ``probability`` the majority-class rate and ``successes`` the correct answers, it is the one-sided
    p-value of an accuracy that high from a classifier no better than the majority class."""
    if not 0 <= successes <= trials:
        raise ValueError(f"binomial_tail needs 0 <= successes <= trials, got successes {successes} and trials {trials}")
    if not 0.0 <= probability <= 1.0:
        raise ValueError(f"binomial_tail probability must be in [0, 1], got {probability}")
    if successes == 0 or probability == 1.0:
        return 1.0
    if probability == 0.0:
        return 0.0
    log_p, log_q = math.log(probability), math.log1p(-probability)
    logs = [
        math.lgamma(trials + 1) - math.lgamma(k + 1) - math.lgamma(trials - k + 1) + k * log_p + (trials - k) * log_q
        for k in range(successes, trials + 1)
    ]
    peak = max(logs)
    return min(1.0, math.exp(peak) * math.fsum(math.exp(value - peak) for value in logs))


def accuracy(predictions, labels) -> float:
    """Fraction of exact matches: ``mean(predictions == labels)``."""
    predictions, labels = _pair(predictions, labels)
    return float((predictions == labels).to(torch.float64).mean())


def f1(predictions, labels) -> float:
    """F1 of the positive class 1: the harmonic mean of precision TP/(TP+FP) and recall TP/(TP+FN),
    i.e. ``2*TP / (2*TP + FP + FN)``.

    Defined as 0.0 when TP = 0, which covers no positive predictions, no positive labels, or both
    (where precision or recall would be 0/0).
    """
    tp, _, fp, fn = _confusion(predictions, labels)
    if tp == 0:
        return 0.0
    return 2 * tp / (2 * tp + fp + fn)


def matthews_correlation(predictions, labels) -> float:
    """Matthews correlation coefficient (GLUE's CoLA metric), binary:
    ``(TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN))``.

    Defined as 0.0 when the denominator is 0 (all predictions or all labels of one class).
    """
    tp, tn, fp, fn = _confusion(predictions, labels)
    denominator = (tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)  # exact integer product
    if denominator == 0:
        return 0.0
    return (tp * tn - fp * fn) / denominator**0.5


def pearson(predictions, targets) -> float:
    """Pearson correlation ``sum(dx*dy) / sqrt(sum(dx^2) * sum(dy^2))`` with ``dx = x - mean(x)``,
    ``dy = y - mean(y)``, computed in float64.

    Defined as 0.0 when either input is constant (the denominator is 0).
    """
    x, y = _scores(predictions, targets)
    dx, dy = x - x.mean(), y - y.mean()
    denominator = torch.sqrt((dx * dx).sum() * (dy * dy).sum())
    if float(denominator) == 0.0:
        return 0.0
    return float(((dx * dy).sum() / denominator).clamp(-1.0, 1.0))


def _average_ranks(values: torch.Tensor) -> torch.Tensor:
    """1-based ranks; tied values share the average of the ranks they span."""
    unique, inverse, counts = torch.unique(values, sorted=True, return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).to(torch.float64)  # last 1-based rank of each group
    starts = ends - counts + 1  # first 1-based rank of each group
    return ((starts + ends) / 2)[inverse]


def spearman(predictions, targets) -> float:
    """Spearman rank correlation: ``pearson(rank(predictions), rank(targets))``, where ties get the
    average of the ranks they span (e.g. ``[10, 20, 20, 30]`` ranks as ``[1, 2.5, 2.5, 4]``).

    Defined as 0.0 when either input is constant, as for ``pearson``.
    """
    x, y = _scores(predictions, targets)
    return pearson(_average_ranks(x), _average_ranks(y))


METRICS: dict[str, Callable[..., float]] = {
    "accuracy": accuracy,
    "f1": f1,
    "matthews": matthews_correlation,
    "pearson": pearson,
    "spearman": spearman,
}

GLUE_METRICS: dict[str, tuple[str, ...]] = {
    "cola": ("matthews",),
    "sst2": ("accuracy",),
    "mrpc": ("f1", "accuracy"),
    "qqp": ("f1", "accuracy"),
    "stsb": ("pearson", "spearman"),
    "mnli": ("accuracy",),
    "qnli": ("accuracy",),
    "rte": ("accuracy",),
}

GLUE_TASKS: tuple[str, ...] = tuple(GLUE_METRICS)


def glue_metrics(task: str, predictions, labels) -> dict[str, float]:
    """The metrics GLUE reports for ``task`` (see ``GLUE_METRICS``), as ``{metric name: value}``.

    ``predictions`` are class ids (float scores for ``stsb``); ``labels`` must have the same shape.
    """
    if task not in GLUE_METRICS:
        raise ValueError(f"task must be one of {list(GLUE_TASKS)}, got {task!r}")
    predictions = torch.as_tensor(predictions)
    labels = torch.as_tensor(labels)
    if predictions.shape != labels.shape:
        raise ValueError(
            f"predictions and labels must have the same shape, got predictions {tuple(predictions.shape)} and labels {tuple(labels.shape)}"
        )
    return {name: METRICS[name](predictions, labels) for name in GLUE_METRICS[task]}
