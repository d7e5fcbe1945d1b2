"""Autoregressive sampling (full recompute per token; no decoding cache yet)."""

from __future__ import annotations

import torch


@torch.no_grad()
def generate(
    model,
    prompt: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Extend ``prompt`` (1-D token ids) by ``max_new_tokens`` sampled tokens; returns the new ids."""
    if model.config.task != "lm":
        raise ValueError(f"generate needs a model with task='lm', got task={model.config.task!r}")
    if prompt.dim() != 1 or prompt.numel() < 1:
        raise ValueError("prompt must be a non-empty 1-D tensor of token ids")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 means greedy), got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    tokens = prompt.to(device)
    for _ in range(max_new_tokens):
        logits = model(tokens[None])[0, -1].float()
        if temperature == 0:
            next_token = logits.argmax()
        else:
            logits = logits / temperature
            if top_k is not None and top_k < logits.numel():
                threshold = logits.topk(top_k).values[-1]
                logits = logits.masked_fill(logits < threshold, float("-inf"))
            probabilities = torch.softmax(logits, dim=-1).cpu()
            next_token = torch.multinomial(probabilities, 1, generator=generator)[0].to(device)
        tokens = torch.cat([tokens, next_token.view(1)])
    model.train(was_training)
    return tokens[prompt.numel() :].cpu()
