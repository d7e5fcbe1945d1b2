"""How a block streams: one body for ``forward`` and ``step``, its parts run plainly or stepped.

A block writes its computation once, as ``body(x, mask, run)``, calling ``run(part, h)`` wherever
a streaming part (a mixer, or a GTU around one) mixes tokens. ``forward`` passes ``Forward``,
which calls ``part(h, mask)``; ``step`` passes ``PartSteps``, which steps each part with its own
state from the block's ``BlockState`` and collects the new ones, in the same order; ``static_step``
passes ``StaticPartSteps`` (each part's ``static_step``, its state updated in place). So a block
never needs to know what kind of mixer it holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..mixers.base import check_static_decoding, common_front_padding_period, common_padding_sides
from ..state import StreamState, check_state
from ..validation import check_int


@dataclass
class BlockState(StreamState):
    """The states of a block's streaming parts, in the order its body runs them."""

    parts: list


class Forward:
    """``run`` for a plain forward: ``part(h, mask)``."""

    def __init__(self, mask: torch.Tensor | None):
        self.mask = mask

    def __call__(self, part, h: torch.Tensor) -> torch.Tensor:
        return part(h, self.mask)


class PartSteps:
    """``run`` for a step: each call steps the next part with the next state of ``state``."""

    def __init__(self, state: BlockState, mask: torch.Tensor | None):
        self.states, self.mask, self.new = iter(state.parts), mask, []

    def __call__(self, part, h: torch.Tensor) -> torch.Tensor:
        y, state = part.step(h, next(self.states), self.mask)
        self.new.append(state)
        return y

    def state(self) -> BlockState:
        return BlockState(self.new)


class StaticPartSteps:
    """``run`` for a static step: each call steps the next part from the next state of ``state``, in place."""

    def __init__(self, state: BlockState):
        self.states = iter(state.parts)

    def __call__(self, part, h: torch.Tensor) -> torch.Tensor:
        return part.static_step(h, next(self.states))


class StreamingBlock:
    """Mixin: ``forward`` and ``step`` from ``body(x, mask, run)`` and the parts ``stream_parts()``."""

    sequence_split = "body"  # context parallelism: the body works token by token around its parts, which split their own way

    def stream_parts(self) -> list:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def padding_invariant_sides(self) -> tuple[str, ...]:
        """The sides every part mixing tokens declares (the rest of the body works token by token)."""
        return common_padding_sides(self.stream_parts())

    @property
    def front_padding_period(self) -> int | None:
        """The least period every part keeps (``Mixer.front_padding_period``)."""
        return common_front_padding_period(self.stream_parts())

    def init_state(
        self, batch_size: int, *, max_length: int | None = None, device=None, dtype: torch.dtype | None = None, masked: int = 0
    ) -> BlockState:
        """Every part's empty state (after ``masked`` padding positions: the parts see them as zeros, whatever
        the body makes of them, so each part's state after padding is the block's)."""
        check_int(batch_size, "batch_size", minimum=0)
        parts = self.stream_parts()
        return BlockState([part.init_state(batch_size, max_length=max_length, device=device, dtype=dtype, masked=masked) for part in parts])

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, run=None) -> torch.Tensor:
        """The body on ``x``; its parts run plainly, or by ``run`` (context parallelism's ``ContextRun``)."""
        return self.body(x, mask, run or Forward(mask))

    def step(self, x: torch.Tensor, state: BlockState, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, BlockState]:
        check_state(state, BlockState, None, None, f"this {type(self).__name__}")  # the parts check batch and dtype
        if len(state.parts) != len(self.stream_parts()):
            raise ValueError(
                f"state holds {len(state.parts)} part states but this {type(self).__name__} streams {len(self.stream_parts())} parts"
            )
        steps = PartSteps(state, mask)
        return self.body(x, mask, steps), steps.state()

    @property
    def static_decoding(self) -> bool:
        """Every part decodes from static buffers (``Mixer.static_decoding``)."""
        return all(part.static_decoding for part in self.stream_parts())

    def static_state(self, state: BlockState, capacity: int) -> BlockState:
        """Every part's state in static buffers (``Mixer.static_state``)."""
        check_static_decoding(self)
        parts = zip(self.stream_parts(), state.parts, strict=True)
        return BlockState([part.static_state(part_state, capacity) for part, part_state in parts])

    def static_step(self, x: torch.Tensor, state: BlockState) -> torch.Tensor:
        """The body on the next token x (batch, 1, dim), every part's state updated in place (``Mixer.static_step``)."""
        return self.body(x, None, StaticPartSteps(state))
