"""``TokenmixCache``: transformers' ``Cache`` over a tokenmix streaming state.

tokenmix models carry one ``ModelState`` holding one entry per block (each block's own state:
Toeplitz histories, EMA and TCN buffers, key/value caches, XL memories), so the cache holds that
state rather than per-layer key/value tensors. ``generate()`` hands it back to the model at every
step; beam search keeps rows with ``reorder_cache`` (``ModelState.select``).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache


class TokenmixCache(Cache):
    """The streaming state of a batch; ``max_length`` is the horizon ``init_state`` plans for."""

    def __init__(self, max_length: int | None = None):
        super().__init__(layers=[])
        self.state, self.rows = None, 0
        self.max_length = max_length

    def start(self, model, batch_size: int, device, segment_length: int | None) -> None:
        """The state before the first token of ``batch_size`` streams of the tokenmix ``model``."""
        self.state = model.init_state(batch_size, device, max_length=self.max_length, segment_length=segment_length)
        self.rows = batch_size

    @property
    def layer_states(self) -> list:
        """One entry per block: that block's state."""
        return [] if self.state is None else list(self.state.blocks)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0 if self.state is None else self.state.position

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1  # no fixed size

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows at ``indices``, in that order (repeats allowed)."""
        self.state, self.rows = self.state.select(indices), len(indices)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.batch_select_indices(torch.arange(self.rows).repeat_interleave(repeats))

    def crop(self, max_length: int) -> None:
        raise NotImplementedError("a tokenmix streaming state cannot be cropped (no assisted or speculative decoding)")

    def reset(self) -> None:
        self.state, self.rows = None, 0

    @property
    def is_compileable(self) -> bool:
        return False

    @property
    def is_croppable(self) -> bool:
        return False

    @property
    def batch_size(self) -> int:
        return self.rows
