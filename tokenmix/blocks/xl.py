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

import torch
from torch import nn

from ..mixers.fnet import FnetAr
from ..options import Configurable, merge_options, take_options
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

    def forward(self, x: torch.Tensor, context: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: normalized segment (batch, n, d); context: normalized [memory; segment]; key_mask: (batch, M + n)."""
        batch, n, dim = x.shape
        total = context.shape[1]
        q = self.query(x).view(batch, n, self.heads, self.head_dim)
        k, v = self.key_value(context).view(batch, total, 2, self.heads, self.head_dim).unbind(2)
        r = self.position(sinusoid_positions(total, dim, x.device).to(x.dtype)).view(total, self.heads, self.head_dim)
        content = torch.einsum("bihd,bjhd->bhij", q + self.content_bias, k)
        by_distance = torch.einsum("bihd,rhd->bhir", q + self.position_bias, r)
        distance = (total - n) + torch.arange(n, device=x.device)[:, None] - torch.arange(total, device=x.device)[None, :]
        position = by_distance.gather(-1, distance.clamp(min=0).expand(batch, self.heads, n, total))
        blocked = distance < 0 if key_mask is None else (distance < 0) | ~key_mask[:, None, None, :]
        scores = ((content + position) / math.sqrt(self.head_dim)).masked_fill(blocked, torch.finfo(x.dtype).min)
        weights = self.dropout(torch.softmax(scores.float(), dim=-1).to(x.dtype))
        return self.out(torch.einsum("bhij,bjhd->bihd", weights, v).reshape(batch, n, dim))


class XlBlock(Configurable, nn.Module):
    """One Transformer-XL layer; ``mixer`` is "attention" or "fnet_ar" (window W = ``window``)."""

    recurrent = True

    def __init__(
        self,
        dim: int,
        causal: bool,
        mixer: str = "attention",
        heads: int = 4,
        memory_length: int = 512,
        window: int = 512,
        ffn_expand: int = 4,
        dropout: float = 0.0,
    ):
        super().__init__()
        if not causal:
            raise ValueError("Transformer-XL blocks are causal: use them with task='lm'")
        if mixer not in XL_MIXERS:
            raise ValueError(f"mixer must be one of {list(XL_MIXERS)}, got {mixer!r}")
        check_int(memory_length, "memory_length", minimum=0)
        self.memory_length = memory_length
        self.mixer_norm = nn.LayerNorm(dim)
        if mixer == "attention":
            self.mixer = RelativeAttention(dim, heads, dropout)
        else:
            self.mixer = FnetAr(dim, True, window=window)
            if memory_length < window - 1:
                raise ValueError(f"memory_length={memory_length} must be >= window - 1 = {window - 1} for fnet_ar layers")
            # FNet normalizes after its Fourier sublayer (post-norm). Here the unnormalized DFT sums
            # (row 0 adds up W inputs) would swamp the pre-norm residual stream, so the output is normalized.
            self.mixed_norm = nn.LayerNorm(dim)
        self.ffn_norm = nn.LayerNorm(dim)
        self.ffn = Ffn(dim, ffn_expand, "gelu", dropout)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, memory: torch.Tensor | None = None, start: int = 0):
        """x: segment (batch, n, d) at stream position ``start``; memory: earlier block inputs (batch, M, d)."""
        h = self.mixer_norm(x)
        history = None if memory is None or memory.shape[1] == 0 else self.mixer_norm(memory)
        if isinstance(self.mixer, FnetAr):
            mixed = self.mixed_norm(self.mixer.mix_stream(h, mask, history, start))
        else:
            context = h if history is None else torch.cat([history, h], dim=1)
            key_mask = None
            if mask is not None:
                remembered = torch.ones(x.shape[0], context.shape[1] - x.shape[1], dtype=torch.bool, device=x.device)
                key_mask = torch.cat([remembered, mask], dim=1)
            mixed = self.mixer(h, context, key_mask)
        x = x + self.dropout(mixed)
        return x + self.dropout(self.ffn(self.ffn_norm(x)))


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
