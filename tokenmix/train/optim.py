"""AdamW parameter groups: which parameters take weight decay.

The rule: weight decay applies to weight matrices (parameters of two or more dimensions) except
those a module names in its ``no_weight_decay`` attribute; biases, norms and scalars never decay.
Modules name the parameters that define a kernel or a position code rather than a linear map
(MEGA's EMA coefficients and q/k scale and offset, SKI-TNO's knot values and band taps, the TCN's
taps, Transformer-XL's u and v biases) and the model names its tied embedding. Decaying those
pulls a learned kernel toward zero instead of regularising a projection. (The same convention as
Mamba's ``_no_weight_decay`` parameters.)
"""

from __future__ import annotations

import torch
from torch import nn


def no_weight_decay_parameters(model: nn.Module) -> set[int]:
    """ids of the parameters some module of ``model`` declares in ``no_weight_decay``."""
    declared = set()
    for module in model.modules():
        for name in getattr(module, "no_weight_decay", ()):
            declared.add(id(module.get_parameter(name)))
    return declared


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: decayed weight matrices, and everything else with weight_decay 0."""
    exempt = no_weight_decay_parameters(model)
    decayed, plain = [], []
    for parameter in model.parameters():
        (decayed if parameter.dim() >= 2 and id(parameter) not in exempt else plain).append(parameter)
    return [{"params": decayed, "weight_decay": weight_decay}, {"params": plain, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, lr: float, weight_decay: float, betas: tuple[float, float]) -> torch.optim.AdamW:
    return torch.optim.AdamW(parameter_groups(model, weight_decay), lr=lr, betas=betas)
