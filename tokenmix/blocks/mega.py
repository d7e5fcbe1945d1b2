"""MEGA block (Ma et al. 2023, §3) and TCNCA's version of it (TCNCA, Terzić et al. 2023, §2 and
Appendix C, Fig. 3), which replaces the damped EMA by a dilated TCN.

Pre-norm, with h = LayerNorm(x):
    v = SiLU(W_v h)                                   (width v_expand * d)
    m = EMA(h) or TCN(h)                              (the ``sequence_mixer``)
    u, z, r, h_x = split(W_m m)                       u = sigmoid(.), z, r = SiLU(.)
    q = z * kappa_q + mu_q,  k = z * kappa_k + mu_k   (diagonal scale and offset of the shared z)
    a = ChunkedAttention(q, k, v)                     single head, scale z_dim^-1/2, relative position
    o = SiLU(h_x + W_h(a * r))
    x = x + u * (o - x)                               (highway residual)
followed by the normalized FFN x + FFN(LayerNorm(x)) with SiLU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..mixers.attention import AttentionCore, RelativePosition, relative_reach
from ..mixers.registry import build_mixer, list_mixers, mixer_class, option_names
from ..options import Configurable, merge_options, take_options
from ..validation import check_int
from .ffn import Ffn
from .streaming import StreamingBlock


def sequence_mixers() -> list[str]:
    """The registered mixers a block can run as its sequence mixer (MEGA's ``ema``, TCNCA's ``tcn``): those
    over a sequence whose options share no name with the block's own (both live in one namespace)."""
    own = set(take_options(MegaBlock.__init__, {})[0])
    return [name for name in list_mixers() if mixer_class(name).token_axes == 1 and not own & option_names(name)]


def check_sequence_mixer(name) -> str:
    if name not in sequence_mixers():
        raise ValueError(f"sequence_mixer must be one of {sequence_mixers()}, got {name!r}")
    return name


def sequence_options(sequence_mixer: str, tcn_depth: int | None, options: dict) -> dict:
    """The sequence mixer's options; ``tcn_depth`` becomes the TCN's ``depth`` (a model's depth is its layer count)."""
    if tcn_depth is None:
        return options
    if sequence_mixer != "tcn":
        raise ValueError(f"tcn_depth applies to a tcn sequence mixer, not {sequence_mixer!r}")
    return {**options, "depth": tcn_depth}


def resolve_with_sequence_mixer(own: dict, rest: dict, sequence_mixer: str, dim: int) -> tuple[dict, dict]:
    """A block's own options plus its sequence mixer's, the TCN's ``depth`` recorded as ``tcn_depth``
    and the attention's bias reach pinned (``relative_reach``)."""
    own = {**own, "max_distance": relative_reach(own["max_distance"], own["chunk_size"])}
    mixer_options, unknown = mixer_class(sequence_mixer).resolve_options(sequence_options(sequence_mixer, own["tcn_depth"], rest), dim)
    if sequence_mixer == "tcn":
        own = {**own, "tcn_depth": mixer_options.pop("depth")}
    return merge_options(own, mixer_options, f"the block with sequence mixer {sequence_mixer!r}"), unknown


class MegaBlock(StreamingBlock, Configurable, nn.Module):
    no_weight_decay = ("qk_scale", "qk_offset")

    def __init__(
        self,
        dim: int,
        causal: bool,
        sequence_mixer: str = "ema",
        z_dim: int = 64,
        v_expand: int = 2,
        chunk_size: int | None = 128,
        position: str = "rotary",
        max_distance: int | None = None,
        ffn_expand: float = 2,
        dropout: float = 0.0,
        tcn_depth: int | None = None,
        **mixer_options,
    ):
        super().__init__()
        check_sequence_mixer(sequence_mixer)
        self.z_dim = check_int(z_dim, "z_dim")
        self.hidden = check_int(v_expand, "v_expand") * dim
        if chunk_size is not None:
            check_int(chunk_size, "chunk_size")
        self.norm = nn.LayerNorm(dim)
        self.value = nn.Linear(dim, self.hidden)
        self.sequence = build_mixer(sequence_mixer, dim, causal, **sequence_options(sequence_mixer, tcn_depth, mixer_options))
        self.gates = nn.Linear(dim, dim + z_dim + self.hidden + dim)  # u, z, r, h_x
        self.qk_scale = nn.Parameter(torch.randn(2, z_dim) * 0.02)
        self.qk_offset = nn.Parameter(torch.zeros(2, z_dim))
        self.position = RelativePosition(position, relative_reach(max_distance, chunk_size))
        if position == "rotary" and z_dim % 2:
            raise ValueError(f"position='rotary' needs an even z_dim, got {z_dim}")
        self.hidden_out = nn.Linear(self.hidden, dim)
        self.dropout = nn.Dropout(dropout)
        self.ffn_norm = nn.LayerNorm(dim)
        self.ffn = Ffn(dim, ffn_expand, "silu", dropout)
        self.attention = AttentionCore(self.position, chunk_size, causal, 1, z_dim, self.hidden)  # one head

    @classmethod
    def resolve_options(cls, options: dict, dim: int) -> tuple[dict, dict]:
        own, rest = take_options(cls.__init__, options)
        return resolve_with_sequence_mixer(own, rest, check_sequence_mixer(own["sequence_mixer"]), dim)

    def stream_parts(self) -> list:
        return [self.sequence, self.attention]

    def body(self, x: torch.Tensor, mask: torch.Tensor | None, run) -> torch.Tensor:
        h = self.norm(x)
        v = F.silu(self.value(h))
        m = self.dropout(run(self.sequence, h))
        u, z, r, h_x = self.gates(m).split([x.shape[-1], self.z_dim, self.hidden, x.shape[-1]], dim=-1)
        z, r = F.silu(z), F.silu(r)
        q, k = (z * self.qk_scale[i] + self.qk_offset[i] for i in range(2))
        attended = run(self.attention, (q[:, None], k[:, None], v[:, None]))[:, 0]  # one head
        o = F.silu(h_x + self.hidden_out(self.dropout(attended * r)))
        x = torch.addcmul(x, torch.sigmoid(u), o - x)
        return x + self.dropout(self.ffn(self.ffn_norm(x)))
