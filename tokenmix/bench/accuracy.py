"""Accuracy of mixed precision (kind ``precision``): a mixer run under autocast against itself in float64.

The input is drawn in the compute dtype and the float64 module reads the same (rounded) values, so the
errors are the computation's own: relative l2 errors ||a - b|| / ||b|| of the output, of the input's
gradient and of the worst parameter's gradient (of <output, u> for a random u). A mixer whose
``inner_precision`` is "float32" rounds only its input and output (bf16 keeps 8 significant bits: about
2e-3 for the rounding alone); one of "autocast" runs its products in the compute dtype too.
"""

from __future__ import annotations

import copy

import torch

from ..precision import autocast
from .cases import Case
from .records import PrecisionMeasurement, identity


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got.detach().double() - expected.detach()).norm() / expected.detach().norm().clamp_min(1e-300))


def autocast_errors(module: torch.nn.Module, x: torch.Tensor, precision: str) -> dict[str, float]:
    """{"output_error", "input_grad_error", "parameter_grad_error"} of ``module`` (float32) run on x (in the compute
    dtype) under autocast to ``precision``, against a float64 copy on the same x; parameters whose float64
    gradient is zero (unused at this length) are left out."""
    reference = copy.deepcopy(module).double()
    upstream = torch.randn(x.shape, device=x.device, dtype=torch.float64, generator=torch.Generator(x.device).manual_seed(0))
    x = x.detach().requires_grad_()
    with autocast(precision, x.device):
        y = module(x)
    got = torch.autograd.grad((y.double() * upstream).sum(), [x, *module.parameters()], allow_unused=True, materialize_grads=True)
    x64 = x.detach().double().requires_grad_()
    y64 = reference(x64)
    targets = [x64, *reference.parameters()]
    expected = torch.autograd.grad((y64 * upstream).sum(), targets, allow_unused=True, materialize_grads=True)
    parameters = [relative_error(a, b) for a, b in zip(got[1:], expected[1:], strict=True) if b.abs().sum() > 0]
    return {
        "output_error": relative_error(y, y64),
        "input_grad_error": relative_error(got[0], expected[0]),
        "parameter_grad_error": max(parameters, default=None),
    }


def measure_precision(case: Case) -> PrecisionMeasurement:
    if case.precision == "fp32":
        raise ValueError("--kinds precision measures a mixed precision against float64: give --precision bf16 or fp16")
    module, inputs = case.build()
    return PrecisionMeasurement(**identity(case, inputs.device), **autocast_errors(module, inputs, case.precision))
