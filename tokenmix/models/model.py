"""Sequence models: embedding -> blocks -> final norm -> task head (TNN, Qin et al. 2023, §3.4).

- task "lm": causal blocks, tied output embedding, logits (batch, length, vocab).
- task "mlm": bidirectional blocks, tied output embedding, logits (batch, length, vocab).
- task "classify": bidirectional blocks, masked mean pooling, logits (batch, num_classes).
The embedding is scaled by sqrt(dim); there is no positional embedding (the mixers carry position).

Recurrent models (Transformer-XL and FNetAR-XL) read a stream segment by segment: each block keeps
the block inputs of recent segments as memory (no gradient), carried in a ``SegmentState``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..mixers.base import check_mask
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
    check_mask(mask, tuple(tokens.shape))


@dataclass
class SegmentState:
    """What a recurrent model carries between segments: per-block memory and the stream position."""

    memory: list[torch.Tensor]
    position: int = 0


class SequenceModel(nn.Module):
    """A stack of blocks chosen by model name, with the head of ``config.task``."""

    no_weight_decay = ("embedding.weight",)  # tied with the output layer

    def __init__(self, config: ModelConfig):
        super().__init__()
        spec = model_spec(config.name)
        self.config = config
        options = config.options  # resolved: every block and mixer option
        dropout = options["dropout"]
        self.embedding = nn.Embedding(config.vocab_size, config.dim)
        nn.init.normal_(self.embedding.weight, std=config.dim**-0.5)
        self.embedding_dropout = nn.Dropout(dropout)
        if config.task not in spec.tasks:
            raise ValueError(f"task for model {config.name!r} must be one of {list(spec.tasks)}, got {config.task!r}")
        self.blocks = nn.ModuleList(spec.layers(config.dim, config.causal, config.depth, **options))
        self.recurrent = any(getattr(block, "recurrent", False) for block in self.blocks)
        self.final_norm = nn.LayerNorm(config.dim)
        self.classifier = nn.Linear(config.dim, config.num_classes) if config.task == "classify" else None

    def hidden_states(self, tokens: torch.Tensor, mask: torch.Tensor | None = None, state: SegmentState | None = None):
        """Final-norm hidden states (batch, n, dim) and, for recurrent models, the next SegmentState."""
        check_tokens(tokens, self.config.vocab_size, mask)
        x = self.embedding_dropout(self.embedding(tokens) * math.sqrt(self.config.dim))
        if not self.recurrent:
            for block in self.blocks:
                x = block(x, mask)
            return self.final_norm(x), None
        memories = state.memory if state is not None else [None] * len(self.blocks)
        start = state.position if state is not None else 0
        kept = []
        for block, memory in zip(self.blocks, memories, strict=True):
            kept.append(_remember(memory, x, block.memory_length))
            x = block(x, mask, memory, start)
        return self.final_norm(x), SegmentState(kept, start + tokens.shape[1])

    def forward(
        self, tokens: torch.Tensor, mask: torch.Tensor | None = None, *, state: SegmentState | None = None, return_state: bool = False
    ):
        """Logits; with ``return_state=True`` also the SegmentState for the next segment (recurrent models)."""
        h, next_state = self.hidden_states(tokens, mask, state)
        if self.classifier is None:
            logits = h @ self.embedding.weight.t()
        elif mask is None:
            logits = self.classifier(h.mean(dim=1))
        else:
            weights = mask.to(h.dtype)[..., None]
            logits = self.classifier((h * weights).sum(dim=1) / weights.sum(dim=1).clamp_min(1.0))
        return (logits, next_state) if return_state else logits

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def save_pretrained(self, directory) -> None:
        from .pretrained import save_pretrained

        save_pretrained(self, directory)


def _remember(memory: torch.Tensor | None, inputs: torch.Tensor, length: int) -> torch.Tensor:
    """The newest ``length`` block inputs of [memory; inputs], detached."""
    inputs = inputs.detach()
    joined = inputs if memory is None else torch.cat([memory, inputs], dim=1)
    return joined[:, max(0, joined.shape[1] - length) :]


def build_model(
    name: str,
    *,
    task: str = "lm",
    vocab_size: int,
    dim: int = 256,
    depth: int = 4,
    num_classes: int | None = None,
    options: dict | None = None,
    **more_options,
) -> SequenceModel:
    """Build a model by name (see ``list_models()``); options reach the blocks and mixers.

    Options are keyword arguments, or the ``options`` dict for names this function takes itself
    (a TCN inside the TNN block: ``build_model("tnn", mixer="tcn", options={"depth": 2}, ...)``).
    """
    config = ModelConfig(name, task, vocab_size, dim, depth, num_classes, {**(options or {}), **more_options})
    return SequenceModel(config)
