"""Sequence models: embedding -> blocks -> final norm -> task head (TNN paper 002, §3.4).

- task "lm": causal blocks, tied output embedding, logits (batch, length, vocab).
- task "mlm": bidirectional blocks, tied output embedding, logits (batch, length, vocab).
- task "classify": bidirectional blocks, masked mean pooling, logits (batch, num_classes).
The embedding is scaled by sqrt(dim); there is no positional embedding (the mixers carry position).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .config import ModelConfig
from .registry import model_spec


def check_tokens(tokens: torch.Tensor, vocab_size: int, mask: torch.Tensor | None) -> None:
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
        shape = tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
        raise ValueError(f"tokens must be a (batch, length) tensor, got {shape}")
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool or tokens.is_complex():
        raise ValueError(f"tokens must be an integer tensor, got dtype {tokens.dtype}")
    if tokens.shape[1] < 1:
        raise ValueError("tokens must have length >= 1")
    if tokens.numel() and (tokens.min() < 0 or tokens.max() >= vocab_size):
        raise ValueError(f"tokens must lie in [0, vocab_size={vocab_size}), got range [{tokens.min()}, {tokens.max()}]")
    if mask is not None and (mask.dtype != torch.bool or mask.shape != tokens.shape):
        raise ValueError(f"mask must be a bool tensor of shape {tuple(tokens.shape)}, got {mask.dtype} {tuple(mask.shape)}")


class SequenceModel(nn.Module):
    """A stack of blocks chosen by model name, with the head of ``config.task``."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        spec = model_spec(config.name)
        self.config = config
        options = {**spec.defaults, **config.options}
        dropout = options.get("dropout", 0.0)
        self.embedding = nn.Embedding(config.vocab_size, config.dim)
        nn.init.normal_(self.embedding.weight, std=config.dim**-0.5)
        self.embedding_dropout = nn.Dropout(dropout)
        try:
            self.blocks = nn.ModuleList(spec.block(config.dim, config.causal, **options) for _ in range(config.depth))
        except TypeError as error:
            raise ValueError(f"bad options for model {config.name!r}: {error}") from None
        self.final_norm = nn.LayerNorm(config.dim)
        self.classifier = nn.Linear(config.dim, config.num_classes) if config.task == "classify" else None

    def hidden_states(self, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        check_tokens(tokens, self.config.vocab_size, mask)
        x = self.embedding_dropout(self.embedding(tokens) * math.sqrt(self.config.dim))
        for block in self.blocks:
            x = block(x, mask)
        return self.final_norm(x)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.hidden_states(tokens, mask)
        if self.classifier is None:
            return h @ self.embedding.weight.t()
        if mask is None:
            pooled = h.mean(dim=1)
        else:
            weights = mask.to(h.dtype)[..., None]
            pooled = (h * weights).sum(dim=1) / weights.sum(dim=1).clamp_min(1.0)
        return self.classifier(pooled)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def save_pretrained(self, directory) -> None:
        from .pretrained import save_pretrained

        save_pretrained(self, directory)


def build_model(
    name: str,
    *,
    task: str = "lm",
    vocab_size: int,
    dim: int = 256,
    depth: int = 4,
    num_classes: int | None = None,
    **options,
) -> SequenceModel:
    """Build a model by name (see ``list_models()``); ``options`` reach the blocks and mixers."""
    model_spec(name)
    config = ModelConfig(name, task, vocab_size, dim, depth, num_classes, options)
    return SequenceModel(config)
