"""Transformer-XL blocks (Dai et al. 2019) and their FNetAR variant (FNetAR, Lou et al. 2021, §II.4, §III).

A block sees the current segment x (batch, n, d) and a memory (batch, M, d): the block inputs of
the previous segments, without gradient. Its mixer reads [memory; segment] as its context
(``Mixer.mix_context``): relative attention (``mixers/relative_attention.py``) or, in the FNetAR
variant, the parameter-free causal Fourier mixing of ``ops/fourier.py`` with the memory as its
window buffer, followed by a LayerNorm (FNet's post-Fourier norm, ``Mixer.normalize_output``).
Pre-norm residuals: x + Mixer(norm(x)), then x + FFN(norm(x)).

Decoding from static buffers (CUDA graphs, ``tokenmix.generation.graphs``), a block keeps a window of its last
M + S inputs instead of the moving memory, and masks by each row's position on the device what the memory would
not hold (``XlBlock.static_step``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..fields import Choice, Integer, Number, setting, setting_fields
from ..mixers.base import check_sequence, check_static_decoding
from ..mixers.parts import Configurable, Part
from ..mixers.registry import list_mixers, mixer_class
from ..options import Options, dropout_setting
from ..state import StreamState, check_state
from ..validation import check_int
from .ffn import Ffn


def context_mixers() -> list[str]:
    """The registered mixers a Transformer-XL block can run: those that mix a segment with its memory (``mixes_context``)."""
    return [name for name in list_mixers() if mixer_class(name).mixes_context]


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


@dataclass
class StaticXlState(StreamState):
    """A Transformer-XL block's stream in fixed buffers (``XlBlock.static_state``): its last L block inputs (batch, L, d),
    the newest last, which of them are real tokens (batch, L), each row's position (batch,) on the device, and the
    segment length (None: one segment)."""

    inputs: torch.Tensor
    real: torch.Tensor
    position: torch.Tensor
    segment_length: int | None = None


@dataclass
class XlOptions(Options):
    memory_length: int = setting(512, Integer(0), "block inputs of earlier segments kept as memory (at least the mixer's reach behind)")
    ffn_expand: float = setting(4, Number(0, open_minimum=True), "width factor of the GELU FFN")
    dropout: float = dropout_setting()
    segment_length: int | None = setting(
        None, Integer(1, optional=True), "streams turn every this many tokens into memory, as training does (a run sets its --seq-len)"
    )


class XlBlock(Configurable, nn.Module):
    """One Transformer-XL layer around a registered ``mixer`` that mixes a context (``context_mixers()``).

    ``segment_length`` S: streamed, every S tokens the segment becomes memory, as in training (runs
    record their ``--seq-len``); None: the whole stream is one segment. ``forward`` reads its input
    as one segment without memory."""

    options_type = XlOptions
    recurrent = True
    sequence_split = "segments"  # context parallelism: each shard gathers the context it reads (``step`` with ``run``)

    @classmethod
    def parts(cls) -> list[Part]:
        return [Part("mixer", "relative_attention", context_mixers)]

    def __init__(self, dim: int, causal: bool, options: XlOptions | None = None):
        super().__init__()
        if not causal:
            raise ValueError("Transformer-XL blocks are causal: use them with task='lm'")
        self.take_options(options, dim)
        self.segment_length, self.memory_length = self.options.segment_length, self.options.memory_length
        self.mixer_norm = nn.LayerNorm(dim)
        self.mixer = self.build_part("mixer", dim, True)
        reach = self.mixer.reach
        if reach is not None and self.memory_length < reach[0]:
            name = self.options.parts["mixer"].name
            raise ValueError(f"memory_length={self.memory_length} must be >= the {reach[0]} tokens the {name} mixer sees before each one")
        # FNetAR's unnormalized DFT sums (row 0 adds up W inputs) would swamp the pre-norm residual stream.
        self.mixed_norm = nn.LayerNorm(dim) if self.mixer.normalize_output else nn.Identity()
        self.ffn_norm = nn.LayerNorm(dim)
        self.ffn = Ffn(dim, self.options.ffn_expand, "gelu", self.options.dropout)
        self.dropout = nn.Dropout(self.options.dropout)

    @property
    def padding_invariant_sides(self) -> tuple[str, ...]:
        """Its mixer's (the norms and the FFN work token by token)."""
        return self.mixer.padding_invariant_sides

    front_padding_period = None  # padded segments would become memory, and memory keeps no padding mask

    def init_state(
        self, batch_size: int, *, max_length: int | None = None, device=None, dtype: torch.dtype | None = None, masked: int = 0
    ) -> XlState:
        """An empty memory and segment, segments of ``segment_length``. No ``masked`` padding: the
        memory would keep the padded positions as tokens (``front_padding_period`` is None)."""
        check_int(batch_size, "batch_size", minimum=0)
        if masked:
            raise ValueError(f"masked must be 0 for a Transformer-XL block (its memory keeps no padding mask), got {masked}")
        return self._empty_state(batch_size, device, dtype, self.segment_length)

    def _empty_state(self, batch_size: int, device, dtype, segment_length: int | None) -> XlState:
        weight = self.ffn_norm.weight
        device, dtype = device or weight.device, dtype or weight.dtype
        empty = torch.zeros(batch_size, 0, weight.shape[0], device=device, dtype=dtype)
        return XlState(empty, empty.clone(), torch.zeros(batch_size, 0, dtype=torch.bool, device=device), 0, segment_length)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, run=None) -> torch.Tensor:
        """One segment without memory (with ``run``: this process's shard of it)."""
        length = None if run is None else run.shard.length
        return self.step(x, self._empty_state(x.shape[0], x.device, x.dtype, length), mask, run)[0]

    def step(self, x: torch.Tensor, state: XlState, mask: torch.Tensor | None = None, run=None) -> tuple[torch.Tensor, XlState]:
        """The next chunk x (batch, k, d) of the stream, split where segments end; with ``run`` (context
        parallelism) x is this process's shard of one whole segment (``_split_segment_step``)."""
        check_sequence(x, self.ffn_norm.weight.shape[0], mask)
        check_state(state, XlState, x.shape[0], x.dtype, "this Transformer-XL block")
        real = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device) if mask is None else mask
        if run is not None:
            return self._split_segment_step(x, real, state, run)
        outputs, done = [], 0
        while done < x.shape[1]:
            room = x.shape[1] - done if state.segment_length is None else state.segment_length - state.segment.shape[1]
            size = min(room, x.shape[1] - done)
            output, state = self._segment_step(x[:, done : done + size], real[:, done : done + size], state)
            outputs.append(output)
            done += size
        return torch.cat(outputs, dim=1), state

    @property
    def static_decoding(self) -> bool:
        """Its mixer mixes a context of fixed length from positions on the device (``Mixer.static_context``)."""
        return self.mixer.static_context

    def static_state(self, state: XlState, capacity: int) -> StaticXlState:
        """The stream's memory and segment, the newest last, in a window of the most inputs a token sees: a full memory
        and its segment up to itself (``memory_length`` + the segment length), at most the ``capacity`` (every input,
        where the stream is one segment)."""
        check_static_decoding(self)
        check_state(state, XlState, None, None, "this Transformer-XL block")
        check_int(capacity, "capacity", minimum=state.position + 1)
        context = torch.cat([state.memory, state.segment], dim=1)
        batch, held, dim = context.shape
        length = capacity if state.segment_length is None else min(capacity, self.memory_length + state.segment_length)
        inputs, real = context.new_zeros(batch, length, dim), torch.zeros(batch, length, dtype=torch.bool, device=context.device)
        inputs[:, length - held :] = context
        real[:, length - held :] = torch.cat([torch.ones_like(state.memory[..., 0], dtype=torch.bool), state.segment_real], dim=1)
        position = torch.full((batch,), state.position, dtype=torch.long, device=context.device)
        return StaticXlState(inputs, real, position, state.segment_length)

    def static_step(self, x: torch.Tensor, state: StaticXlState) -> torch.Tensor:
        """The next token x (batch, 1, d), the window shifted by one in place. A token at position t sees, as in ``step``,
        its segment up to itself (its real tokens) and the ``memory_length`` inputs before the segment's start
        s = t - t mod S (every earlier input where the stream is one segment)."""
        length, t = state.inputs.shape[1], state.position
        state.inputs.copy_(torch.cat([state.inputs[:, 1:], x.detach()], dim=1))
        state.real.copy_(torch.cat([state.real[:, 1:], torch.ones_like(state.real[:, :1])], dim=1))
        positions = t[:, None] + torch.arange(1 - length, 1, device=x.device)  # of the window's inputs
        key_mask = positions >= 0
        if state.segment_length is None:
            key_mask &= state.real
        else:
            start = (t - t.remainder(state.segment_length))[:, None]
            key_mask &= (positions >= start - self.memory_length) & ((positions < start) | state.real)
        normed = self.mixer_norm(state.inputs)
        mixed = self.mixer.in_inner_precision(self.mixer.mix_static_context, normed[:, -1:], normed, key_mask, t)
        state.position.add_(1)
        return self._residuals(x, mixed)

    def _residuals(self, x: torch.Tensor, mixed: torch.Tensor) -> torch.Tensor:
        """x plus the mixer's output ``mixed`` (normed where the mixer asks it), then plus the FFN's (Dai et al. 2019, §3.2)."""
        y = x + self.dropout(self.mixed_norm(mixed))
        return y + self.dropout(self.ffn(self.ffn_norm(y)))

    def _segment_step(self, x: torch.Tensor, real: torch.Tensor, state: XlState) -> tuple[torch.Tensor, XlState]:
        """Tokens within one segment: the mixer over [memory; segment; x], then the FFN (Dai et al. 2019, §3.2)."""
        context = torch.cat([state.memory, state.segment, x], dim=1)
        remembered = torch.ones(x.shape[0], state.memory.shape[1], dtype=torch.bool, device=x.device)
        key_mask = torch.cat([remembered, state.segment_real, real], dim=1)
        normed = self.mixer_norm(context)
        mixed = self.mixer.in_inner_precision(self.mixer.mix_context, normed[:, -x.shape[1] :], normed, key_mask, state.position)
        y = self._residuals(x, mixed)
        segment, segment_real = torch.cat([state.segment, x], dim=1), torch.cat([state.segment_real, real], dim=1)
        memory = state.memory
        if segment.shape[1] == state.segment_length:
            memory = torch.cat([memory, segment.detach()], dim=1)[:, max(0, memory.shape[1] + segment.shape[1] - self.memory_length) :]
            segment, segment_real = segment[:, :0].detach(), segment_real[:, :0]
        return y, XlState(memory, segment, segment_real, state.position + x.shape[1], state.segment_length)

    def _split_segment_step(self, x: torch.Tensor, real: torch.Tensor, state: XlState, run) -> tuple[torch.Tensor, XlState]:
        """This process's shard [start, stop) of a whole segment split over a context-parallel group: the
        mixer reads [memory; segment[0, stop)], the normed inputs of earlier shards gathered from them (a
        halo that reaches back to the segment's start: attention sees the whole segment before a token),
        and every process builds the same next memory from the segment's last ``memory_length`` inputs."""
        shard = run.shard
        if state.segment.shape[1] or state.segment_length != shard.length:
            raise ValueError(
                f"a sequence split over processes runs whole segments: this stream's segments are {state.segment_length} "
                f"tokens and {state.segment.shape[1]} of one are in hand, the split sequence {shard.length}"
            )
        normed = self.mixer_norm(x)
        before, _ = run.span(normed, lambda start, stop, length: (0, stop))
        context = torch.cat([self.mixer_norm(state.memory), before], dim=1)
        prefix_real = run.mask_of(0, shard.stop)
        prefix_real = torch.ones(x.shape[0], shard.stop, dtype=torch.bool, device=x.device) if prefix_real is None else prefix_real
        remembered = torch.ones(x.shape[0], state.memory.shape[1], dtype=torch.bool, device=x.device)
        key_mask = torch.cat([remembered, prefix_real], dim=1)
        mixed = self.mixer.in_inner_precision(self.mixer.mix_context, normed, context, key_mask, state.position + shard.start)
        y = self._residuals(x, mixed)
        kept = min(self.memory_length, shard.length)
        tail, _ = run.span(x.detach(), lambda start, stop, length: (length - kept, length))
        memory = torch.cat([state.memory, tail], dim=1)[:, max(0, state.memory.shape[1] + kept - self.memory_length) :]
        return y, XlState(memory, state.segment, state.segment_real, state.position + shard.length, state.segment_length)


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


@dataclass
class FourierXlOptions(XlOptions):
    fourier_layers: int | None = setting(None, Integer(0, optional=True), "layers that mix by FNetAR (null: half of them)")
    fourier_placement: str = setting("alternating", Choice(FOURIER_PLACEMENTS), "where those layers go: alternating, bottom or top")


class FourierXlStack(Configurable):
    """Transformer-XL layers with ``fourier_layers`` (default half) of them FNetAR (Lou et al. 2021, §III):
    ``attention`` the options of the others' relative attention, ``fourier`` those of their FNetAR."""

    options_type = FourierXlOptions

    @classmethod
    def parts(cls) -> list[Part]:
        return [Part("attention", "relative_attention"), Part("fourier", "fnet_ar")]

    def __call__(self, dim: int, causal: bool, depth: int, options: FourierXlOptions) -> list[nn.Module]:
        """``depth`` Transformer-XL layers from the stack's resolved ``options`` (``resolve_layers``)."""
        chosen = fourier_layer_indices(depth, options.fourier_layers, options.fourier_placement)
        shared = {spec.name: getattr(options, spec.name) for spec in setting_fields(XlOptions)}
        layers = {key: XlOptions(**shared, parts={"mixer": options.parts[key]}) for key in ("attention", "fourier")}
        return [XlBlock(dim, causal, layers["fourier" if index in chosen else "attention"]) for index in range(depth)]

    def resolve_layers(self, options: dict, dim: int, depth: int) -> tuple[FourierXlOptions, dict]:
        """Its options and its parts', ``fourier_layers`` resolved to a count."""
        if "mixer" in options:
            raise ValueError("fnet_ar_xl picks each layer's mixer by fourier_layers and fourier_placement; 'mixer' is not an option")
        tree, unknown = self.resolve_options(options, dim)
        if tree.fourier_layers is None:
            tree.fourier_layers = depth // 2
        fourier_layer_indices(depth, tree.fourier_layers, tree.fourier_placement)  # validates both
        return tree, unknown
