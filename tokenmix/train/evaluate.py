"""Evaluation: cross-entropy, bits per byte (BPC = loss / ln 2) and perplexity."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..data.batches import contiguous_windows, mask_tokens, step_generator


def _summary(total_loss: float, tokens: int) -> dict:
    loss = total_loss / max(tokens, 1)
    return {"loss": loss, "bpc": loss / math.log(2), "ppl": math.exp(min(loss, 50.0)), "tokens": tokens}


@torch.no_grad()
def evaluate_lm(model, data: torch.Tensor, length: int, batch_size: int = 8, max_tokens: int | None = None) -> dict:
    """Next-token loss over non-overlapping windows of ``length`` (no context carried across windows)."""
    if max_tokens is not None:
        data = data[: max_tokens + 1]
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total, count = 0.0, 0
    windows = list(contiguous_windows(data, length))
    for start in range(0, len(windows), batch_size):
        inputs, targets, mask = (torch.stack(column).to(device) for column in zip(*windows[start : start + batch_size], strict=True))
        logits = model(inputs, mask if not bool(mask.all()) else None)
        losses = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="none")
        total += float(losses[mask.flatten()].sum())
        count += int(mask.sum())
    model.train(was_training)
    return _summary(total, count)


@torch.no_grad()
def evaluate_mlm(
    model, data: torch.Tensor, length: int, mask_id: int, batch_size: int = 8, max_tokens: int | None = None, seed: int = 0
) -> dict:
    """Masked-LM loss on the selected tokens, with masking fixed by ``seed``."""
    if max_tokens is not None:
        data = data[: max_tokens + 1]
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total, count = 0.0, 0
    rows = [inputs for inputs, _, mask in contiguous_windows(data, length) if bool(mask.all())] or [data[:length].long()]
    generator = step_generator(seed, 0)
    for start in range(0, len(rows), batch_size):
        tokens = torch.stack(rows[start : start + batch_size])
        inputs, targets = mask_tokens(tokens, mask_id, mask_id, generator)
        logits = model(inputs.to(device))
        total += float(F.cross_entropy(logits.flatten(0, 1).float(), targets.to(device).flatten(), reduction="sum", ignore_index=-100))
        count += int((targets != -100).sum())
    model.train(was_training)
    return _summary(total, count)
