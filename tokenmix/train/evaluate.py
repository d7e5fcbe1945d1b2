"""Evaluation: cross-entropy, perplexity per token and bits per byte; recall and classification
accuracy; the GLUE metrics.

Bits per byte = the total negative log-likelihood in bits over the number of bytes of text the
predicted tokens stand for (``byte_lengths[id]``), so runs with different tokenizers compare on one
scale; with byte tokens it is the loss / ln 2 (bits per character of the byte-level papers).

Windows of ``length`` tokens cover the split without overlap (no context carried across
windows); the last window is padded and masked. Recurrent models (Transformer-XL family) read
the split as ``batch_size`` contiguous streams instead, segment by segment, memory carried.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..data.batches import contiguous_windows, mask_tokens, step_generator
from ..data.examples import Examples

EVAL_BATCH = 8  # examples per forward pass when evaluating: memory stays near one training batch's forward


def _summary(total_loss: float, tokens: int, text_bytes: int) -> dict:
    loss = total_loss / max(tokens, 1)
    bits_per_byte = total_loss / math.log(2) / max(text_bytes, 1)
    return {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "bpb": bits_per_byte, "tokens": tokens, "bytes": text_bytes}


def _bytes(targets: torch.Tensor, byte_lengths: torch.Tensor | None) -> int:
    """Bytes of text the predicted ``targets`` (-100: none) stand for; one per token without a table."""
    predicted = targets[targets != -100]
    return predicted.numel() if byte_lengths is None else int(byte_lengths[predicted.cpu()].sum())


@torch.no_grad()
def _evaluate(
    model, data: torch.Tensor, length: int, batch_size: int, max_tokens: int | None, objective: Callable, byte_lengths: torch.Tensor | None
) -> dict:
    """Sum the loss of ``objective(inputs, next_tokens, mask) -> (model inputs, targets)`` over windows."""
    if max_tokens is not None:
        data = data[: max_tokens + 1]
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total, count, text_bytes = 0.0, 0, 0
    windows = contiguous_windows(data, length)  # read as they are evaluated: a prepared split stays on disk
    while batch := list(itertools.islice(windows, batch_size)):
        inputs, next_tokens, mask = (torch.stack(column) for column in zip(*batch, strict=True))
        inputs, targets = objective(inputs, next_tokens, mask)
        targets = targets.masked_fill(~mask, -100).to(device)
        logits = model(inputs.to(device), None if bool(mask.all()) else mask.to(device))
        total += float(F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="sum", ignore_index=-100))
        count += int((targets != -100).sum())
        text_bytes += _bytes(targets, byte_lengths)
    model.train(was_training)
    return _summary(total, count, text_bytes)


@torch.no_grad()
def _evaluate_streams(model, data: torch.Tensor, length: int, batch_size: int, byte_lengths: torch.Tensor | None) -> dict:
    """Next-token loss over contiguous streams read in segments of ``length``, memory carried (the
    model's weights with ``segment_length=length``: a run's own length is its segment)."""
    if model.config.options.get("segment_length") != length:
        model = model.with_options(segment_length=length)
    rows = max(1, min(batch_size, (data.numel() - 1) // length))
    stream_length = (data.numel() - 1) // rows
    starts = [row * stream_length for row in range(rows)]
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total, text_bytes, state = 0.0, 0, model.init_state(rows, device=device)
    for start in range(0, stream_length, length):
        end = min(start + length, stream_length) + 1
        window = torch.stack([data[first + start : first + end] for first in starts]).long().to(device)
        logits, state = model(window[:, :-1], state=state, return_state=True)
        total += float(F.cross_entropy(logits.flatten(0, 1).float(), window[:, 1:].flatten(), reduction="sum"))
        text_bytes += _bytes(window[:, 1:], byte_lengths)
    model.train(was_training)
    return _summary(total, rows * stream_length, text_bytes)


def evaluate_lm(
    model,
    data: torch.Tensor,
    length: int,
    batch_size: int = EVAL_BATCH,
    max_tokens: int | None = None,
    byte_lengths: torch.Tensor | None = None,
) -> dict:
    """Next-token loss of a causal LM (recurrent models: with memory carried across segments);
    ``byte_lengths`` (bytes per token id) for bits per byte, else one byte per token."""
    if getattr(model, "recurrent", False):
        return _evaluate_streams(model, data if max_tokens is None else data[: max_tokens + 1], length, batch_size, byte_lengths)
    return _evaluate(model, data, length, batch_size, max_tokens, lambda inputs, next_tokens, mask: (inputs, next_tokens), byte_lengths)


def evaluate_mlm(
    model,
    data: torch.Tensor,
    length: int,
    mask_id: int,
    batch_size: int = EVAL_BATCH,
    max_tokens: int | None = None,
    seed: int = 0,
    *,
    vocab_size: int | None = None,
    byte_lengths: torch.Tensor | None = None,
) -> dict:
    """Masked-LM loss on the selected tokens, with the masking fixed by ``seed``; random replacements
    are drawn from ``[0, vocab_size)`` (default: ``[0, mask_id)``, the byte models' mask past the bytes)."""
    generator = step_generator(seed, 0)

    def masked(inputs, next_tokens, mask):
        return mask_tokens(inputs, mask_id, mask_id if vocab_size is None else vocab_size, generator)

    return _evaluate(model, data, length, batch_size, max_tokens, masked, byte_lengths)


@torch.no_grad()
def evaluate_recall(
    model, inputs: torch.Tensor, targets: torch.Tensor, batch_size: int = EVAL_BATCH, max_examples: int | None = None
) -> dict:
    """Associative recall: loss and accuracy of the last position (the recalled value) only."""
    if max_examples is not None:
        inputs, targets = inputs[:max_examples], targets[:max_examples]
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total, correct = 0.0, 0
    for start in range(0, inputs.shape[0], batch_size):
        logits = model(inputs[start : start + batch_size].to(device))[:, -1].float()
        answers = targets[start : start + batch_size, -1].to(device)
        total += float(F.cross_entropy(logits, answers, reduction="sum"))
        correct += int((logits.argmax(-1) == answers).sum())
    model.train(was_training)
    count = inputs.shape[0]
    return {"loss": total / count, "accuracy": correct / count, "examples": count}


@torch.no_grad()
def predict(model, examples: Examples, batch_size: int = EVAL_BATCH, multiple: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """The classifier's outputs (count, classes) and the labels of every example, in the examples'
    order. Batches group examples of similar length (sorted), so little is spent on padding (each
    padded to a ``multiple`` of tokens)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    order = torch.argsort(examples.lengths().max(dim=1).values)
    # Written in place: a small output kept from each batch would sit between the next batch's freed
    # temporaries and fragment the heap (the resident set grew by GBs over Retrieval's 18,090 pairs).
    outputs = torch.empty(len(examples), model.config.num_classes)
    for start in range(0, len(examples), batch_size):
        rows = order[start : start + batch_size]
        tokens, mask, _ = (t.to(device) for t in examples.batch(rows, multiple=multiple))
        outputs[rows] = model(tokens, None if bool(mask.all()) else mask).float().cpu()
    model.train(was_training)
    return outputs, examples.labels


def evaluate_classification(model, examples: Examples, batch_size: int = EVAL_BATCH, multiple: int = 1) -> dict:
    """Loss and accuracy of a classifier over every example."""
    logits, labels = predict(model, examples, batch_size, multiple)
    count = len(examples)
    loss = float(F.cross_entropy(logits, labels, reduction="sum")) / max(count, 1)
    return {"loss": loss, "accuracy": int((logits.argmax(-1) == labels).sum()) / max(count, 1), "examples": count}


SCORES = ("accuracy", "f1", "matthews", "pearson", "spearman")


def describe(metrics: dict) -> str:
    """One line: loss and scores (recall, classification, GLUE) or loss and bits per byte (language modelling)."""
    if "bpb" not in metrics:
        scores = "  ".join(
            f"{name} {metrics[name]:.2%}" if name == "accuracy" else f"{name} {metrics[name]:.4f}" for name in SCORES if name in metrics
        )
        floor = f", majority class {metrics['majority_accuracy']:.2%}" if "majority_accuracy" in metrics else ""
        return f"loss {metrics['loss']:.4f}  {scores}  ({metrics['examples']} examples{floor})"
    return f"loss {metrics['loss']:.4f}  bits/byte {metrics['bpb']:.4f}  ({metrics['tokens']} tokens)"
