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

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from ..fields import Choice, Integer, Number, setting
from ..mixers.attention import POSITIONS, AttentionCore, RelativePosition, relative_reach
from ..mixers.parts import Configurable, Part
from ..mixers.registry import list_mixers, mixer_class
from ..options import Options, dropout_setting
from .ffn import Ffn
from .streaming import StreamingBlock


def sequence_mixers() -> list[str]:
    """The registered mixers a block can run as its sequence mixer (MEGA's ``ema``, TCNCA's ``tcn``): those over a sequence."""
    return [name for name in list_mixers() if mixer_class(name).token_axes == 1]


@dataclass
class MegaOptions(Options):
    z_dim: int = setting(64, Integer(1), "width z of the shared query and key")
    v_expand: int = setting(2, Integer(1), "value width factor: values have v_expand * dim channels")
    chunk_size: int | None = setting(128, Integer(1, optional=True), "attention within blocks of this many tokens; null: full attention")
    position: str = setting("rotary", Choice(POSITIONS), "rotary, bias (a learned scalar per offset) or none")
    max_distance: int | None = setting(
        None, Integer(1, optional=True), "offsets of the learned bias beyond this share one value (null: the chunk, else 1024)"
    )
    ffn_expand: float = setting(2, Number(0, open_minimum=True), "width factor of the normalized SiLU FFN")
    dropout: float = dropout_setting()

    def pinned(self, dim: int) -> MegaOptions:
        return replace(self, max_distance=relative_reach(self.max_distance, self.chunk_size))


class MegaBlock(StreamingBlock, Configurable, nn.Module):
    """MEGA's block around any ``sequence_mixer`` over a sequence (``ema`` in MEGA, ``tcn`` in TCNCA)."""

    options_type = MegaOptions
    no_weight_decay = ("qk_scale", "qk_offset")

    @classmethod
    def parts(cls) -> list[Part]:
        return [Part("sequence_mixer", "ema", sequence_mixers)]

    def __init__(self, dim: int, causal: bool, options: MegaOptions | None = None):
        super().__init__()
        self.take_options(options, dim)
        o = self.options
        if o.position == "rotary" and o.z_dim % 2:
            raise ValueError(f"position='rotary' needs an even z_dim, got {o.z_dim}")
        self.z_dim, self.hidden = o.z_dim, o.v_expand * dim
        self.norm = nn.LayerNorm(dim)
        self.value = nn.Linear(dim, self.hidden)
        self.sequence = self.build_part("sequence_mixer", dim, causal)
        self.gates = nn.Linear(dim, dim + o.z_dim + self.hidden + dim)  # u, z, r, h_x
        self.qk_scale = nn.Parameter(torch.randn(2, o.z_dim) * 0.02)
        self.qk_offset = nn.Parameter(torch.zeros(2, o.z_dim))
        self.position = RelativePosition(o.position, o.max_distance)
        self.hidden_out = nn.Linear(self.hidden, dim)
        self.dropout = nn.Dropout(o.dropout)
        self.ffn_norm = nn.LayerNorm(dim)
        self.ffn = Ffn(dim, o.ffn_expand, "silu", o.dropout)
        self.attention = AttentionCore(self.position, o.chunk_size, causal, 1, o.z_dim, self.hidden)  # one head

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
