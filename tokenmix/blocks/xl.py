"""Transformer-XL blocks (Dai et al. 2019) and their FNetAR variant (FNetAR, Lou et al. 2021, §II.4, §III).

A block sees the current segment x (batch, n, d) and a memory (batch, M, d): the block inputs of
the previous segments, without gradient. Attention runs over [memory; segment] with relative
positions (Dai et al. §3.3): for query i (stream offset M + i) and key j,

    score(i, j) = (q_i + u) . k_j + (q_i + v) . W_R R_{M+i-j},   R sinusoidal, u, v learned,

masked to j <= M + i (causal). The relative term is computed for every distance and gathered
into place (instead of the "rel-shift" reshaping trick). The FNetAR variant replaces attention by
the parameter-free causal Fourier mixing of ``ops/fourier.py`` with the memory as its history,
followed by a LayerNorm (FNet's post-Fourier norm). Pre-norm residuals: x + Mixer(norm(x)),
then x + FFN(norm(x)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..mixers.base import PADDING_SIDES, check_sequence
from ..mixers.fnet import FnetAr, FnetArState
from ..options import Configurable, merge_options, take_options
from ..state import StreamState, check_state
from ..validation import check_int
from .ffn import Ffn

XL_MIXERS = ("attention", "fnet_ar")


def sinusoid_positions(count: int, dim: int, device=None) -> torch.Tensor:
    """(count, dim) sinusoidal encodings of distances 0 .. count - 1 (Vaswani et al.)."""
    distances = torch.arange(count, device=device, dtype=torch.float32)[:, None]
    frequencies = torch.exp(torch.arange(0, dim, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / dim))
    encoding = torch.zeros(count, dim, device=device)
    encoding[:, 0::2] = torch.sin(distances * frequencies)
    encoding[:, 1::2] = torch.cos(distances * frequencies)[:, : dim // 2]
    return encoding


class RelativeAttention(nn.Module):
    """Multi-head causal attention of a segment over [memory; segment] with relative positions."""

    no_weight_decay = ("content_bias", "position_bias")
    padding_invariant_sides = PADDING_SIDES  # scores depend on distances only

    def __init__(self, dim: int, heads: int = 4, dropout: float = 0.0):
        super().__init__()
        check_int(heads, "heads")
        if dim % heads:
            raise ValueError(f"dim={dim} must be divisible by heads={heads}")
        self.heads, self.head_dim = heads, dim // heads
        self.query = nn.Linear(dim, dim)
        self.key_value = nn.Linear(dim, 2 * dim)
        self.position = nn.Linear(dim, dim, bias=False)
        self.content_bias = nn.Parameter(torch.zeros(heads, self.head_dim))  # u
        self.position_bias = nn.Parameter(torch.zeros(heads, self.head_dim))  # v
        self.out = nn.Linear(dim, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, context: torch.Tensor, key_mask: torch.Tensor, start: int) -> torch.Tensor:
        """x: the newest n normalized inputs (batch, n, d); context: normalized [memory; segment] ending with x;
        key_mask: (batch, M + n), True at keys that may be seen (relative attention: ``start`` unused)."""
        batch, n, dim = x.shape
        total = context.shape[1]
        q = self.query(x).view(batch, n, self.heads, self.head_dim)
        k, v = self.key_value(context).view(batch, total, 2, self.heads, self.head_dim).unbind(2)
        r = self.position(sinusoid_positions(total, dim, x.device).to(x.dtype)).view(total, self.heads, self.head_dim)
        content = torch.einsum("bihd,bjhd->bhij", q + self.content_bias, k)
        by_distance = torch.einsum("bihd,rhd->bhir", q + self.position_bias, r)
        distance = (total - n) + torch.arange(n, device=x.device)[:, None] - torch.arange(total, device=x.device)[None, :]
        position = by_distance.gather(-1, distance.clamp(min=0).expand(batch, self.heads, n, total))
        itself = distance == 0
        blocked = (distance < 0) | ~(key_mask[:, None, None, :] | itself)
        scores = ((content + position) / math.sqrt(self.head_dim)).masked_fill(blocked, torch.finfo(x.dtype).min)
        weights = self.dropout(torch.softmax(scores.to(torch.promote_types(scores.dtype, torch.float32)), dim=-1).to(x.dtype))
        return self.out(torch.einsum("bhij,bjhd->bihd", weights, v).reshape(batch, n, dim))


class FourierContext(nn.Module):
    """FNetAR mixing of the newest n inputs with the context before them as its window buffer."""

    def __init__(self, dim: int, window: int):
        super().__init__()
        self.fourier = FnetAr(dim, True, window=window)

    @property
    def padding_invariant_sides(self) -> tuple[str, ...]:
        """Its FNetAR's."""
        return self.fourier.padding_invariant_sides

    def forward(self, x: torch.Tensor, context: torch.Tensor, key_mask: torch.Tensor, start: int) -> torch.Tensor:
        n, window = x.shape[1], self.fourier.window
        before = context[:, :-n].masked_fill(~key_mask[:, :-n, None], 0.0)[:, -(window - 1) :] if window > 1 else context[:, :0]
        history = torch.nn.functional.pad(before, (0, 0, window - 1 - before.shape[1], 0))
        return self.fourier.step_chunk(x.masked_fill(~key_mask[:, -n:, None], 0.0), FnetArState(history, start), None)[0]


@dataclass
class XlState(StreamState):
    """A Transformer-XL block's stream: ``memory`` (batch, <= M, d), the block inputs of earlier segments
    (no gradient); ``segment`` (batch, s, d), those of the current segment, and which are real tokens;
    the stream position; and the segment length after which the segment becomes memory (None: one
    segment that never ends, the same as one forward over the whole stream)."""

    memory: torch.Tensor
    segment: torch.Tensor
    segment_real: torch.Tensor
    position: int = 0
    segment_length: int | None = None


class XlBlock(Configurable, nn.Module):
    """One Transformer-XL layer; ``mixer`` is "attention" or "fnet_ar" (window W = ``window``).

    ``segment_length`` S: streamed, every S tokens the segment becomes memory, as in training (runs
    record their ``--seq-len``); None: the whole stream is one segment. ``forward`` reads its input
    as one segment without memory."""

    recurrent = True

    def __init__(
        self,
        dim: int,
        causal: bool,
        mixer: str = "attention",
        heads: int = 4,
        memory_length: int = 512,
        window: int = 512,
        ffn_expand: float = 4,
        dropout: float = 0.0,
        segment_length: int | None = None,
    ):
        super().__init__()
        if not causal:
            raise ValueError("Transformer-XL blocks are causal: use them with task='lm'")
        self.segment_length = None if segment_length is None else check_int(segment_length, "segment_length")
        if mixer not in XL_MIXERS:
            raise ValueError(f"mixer must be one of {list(XL_MIXERS)}, got {mixer!r}")
        check_int(memory_length, "memory_length", minimum=0)
        self.memory_length = memory_length
        self.mixer_norm = nn.LayerNorm(dim)
        if mixer == "attention":
            self.mixer = RelativeAttention(dim, heads, dropout)
            self.mixed_norm = nn.Identity()
        else:
            self.mixer = FourierContext(dim, window)
            if memory_length < window - 1:
                raise ValueError(f"memory_length={memory_length} must be >= window - 1 = {window - 1} for fnet_ar layers")
            # FNet normalizes after its Fourier sublayer (post-norm). Here the unnormalized DFT sums
            # (row 0 adds up W inputs) would swamp the pre-norm residual stream, so the output is normalized.
            self.mixed_norm = nn.LayerNorm(dim)
        self.ffn_norm = nn.LayerNorm(dim)
        self.ffn = Ffn(dim, ffn_expand, "gelu", dropout)
        self.dropout = nn.Dropout(dropout)

    @property
    def padding_invariant_sides(self) -> tuple[str, ...]:
        """Its mixer's (the norms and the FFN work token by token)."""
        return self.mixer.padding_invariant_sides

    def init_state(self, batch_size: int, *, max_length: int | None = None, device=None, dtype: torch.dtype | None = None) -> XlState:
        """An empty memory and segment, segments of ``segment_length``."""
        check_int(batch_size, "batch_size", minimum=0)
        return self._empty_state(batch_size, device, dtype, self.segment_length)

    def _empty_state(self, batch_size: int, device, dtype, segment_length: int | None) -> XlState:
        weight = self.ffn_norm.weight
        device, dtype = device or weight.device, dtype or weight.dtype
        empty = torch.zeros(batch_size, 0, weight.shape[0], device=device, dtype=dtype)
        return XlState(empty, empty.clone(), torch.zeros(batch_size, 0, dtype=torch.bool, device=device), 0, segment_length)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """One segment without memory."""
        return self.step(x, self._empty_state(x.shape[0], x.device, x.dtype, None), mask)[0]

    def step(self, x: torch.Tensor, state: XlState, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, XlState]:
        """The next chunk x (batch, k, d) of the stream, split where segments end."""
        check_sequence(x, self.ffn_norm.weight.shape[0], mask)
        check_state(state, XlState, x.shape[0], x.dtype, "this Transformer-XL block")
        real = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device) if mask is None else mask
        outputs, done = [], 0
        while done < x.shape[1]:
            room = x.shape[1] - done if state.segment_length is None else state.segment_length - state.segment.shape[1]
            size = min(room, x.shape[1] - done)
            output, state = self._segment_step(x[:, done : done + size], real[:, done : done + size], state)
            outputs.append(output)
            done += size
        return torch.cat(outputs, dim=1), state

    def _segment_step(self, x: torch.Tensor, real: torch.Tensor, state: XlState) -> tuple[torch.Tensor, XlState]:
        """Tokens within one segment: the mixer over [memory; segment; x], then the FFN (Dai et al. 2019, §3.2)."""
        context = torch.cat([state.memory, state.segment, x], dim=1)
        remembered = torch.ones(x.shape[0], state.memory.shape[1], dtype=torch.bool, device=x.device)
        key_mask = torch.cat([remembered, state.segment_real, real], dim=1)
        normed = self.mixer_norm(context)
        mixed = self.mixed_norm(self.mixer(normed[:, -x.shape[1] :], normed, key_mask, state.position))
        y = x + self.dropout(mixed)
        y = y + self.dropout(self.ffn(self.ffn_norm(y)))
        segment, segment_real = torch.cat([state.segment, x], dim=1), torch.cat([state.segment_real, real], dim=1)
        memory = state.memory
        if segment.shape[1] == state.segment_length:
            memory = torch.cat([memory, segment.detach()], dim=1)[:, max(0, memory.shape[1] + segment.shape[1] - self.memory_length) :]
            segment, segment_real = segment[:, :0].detach(), segment_real[:, :0]
        return y, XlState(memory, segment, segment_real, state.position + x.shape[1], state.segment_length)


FOURIER_PLACEMENTS = ("alternating", "bottom", "top")


def fourier_layer_indices(depth: int, count: int, placement: str) -> set[int]:
    """Which of ``depth`` layers use fnet_ar: ``count`` of them, at the bottom, top or alternating."""
    if placement not in FOURIER_PLACEMENTS:
        raise ValueError(f"fourier_placement must be one of {list(FOURIER_PLACEMENTS)}, got {placement!r}")
    check_int(count, f"fourier_layers (depth={depth})", minimum=0, maximum=depth)
    if placement == "bottom":
        return set(range(count))
    if placement == "top":
        return set(range(depth - count, depth))
    spacing = depth / count if count else 0
    return {depth - 1 - int(i * spacing) for i in range(count)}


class FourierXlStack:
    """Transformer-XL layers with ``fourier_layers`` (default half) of them FNetAR (Lou et al. 2021, §III)."""

    def __call__(
        self, dim: int, causal: bool, depth: int, /, fourier_layers: int | None = None, fourier_placement: str = "alternating", **options
    ) -> list[nn.Module]:
        count = depth // 2 if fourier_layers is None else fourier_layers
        chosen = fourier_layer_indices(depth, count, fourier_placement)
        return [XlBlock(dim, causal, "fnet_ar" if index in chosen else "attention", **options) for index in range(depth)]

    def resolve_options(self, options: dict, dim: int, depth: int) -> tuple[dict, dict]:
        """The stack's options (``fourier_layers`` resolved to a count) and the XL block's, without ``mixer``."""
        if "mixer" in options:
            raise ValueError("fnet_ar_xl picks each layer's mixer by fourier_layers and fourier_placement; 'mixer' is not an option")
        own, rest = take_options(self.__call__, options)
        if own["fourier_layers"] is None:
            own["fourier_layers"] = depth // 2
        fourier_layer_indices(depth, own["fourier_layers"], own["fourier_placement"])  # validates both
        block, unknown = XlBlock.resolve_options(rest, dim)
        block.pop("mixer")
        return merge_options(own, block, "fnet_ar_xl's stack"), unknown
