"""Temporal convolutional network, TCN (TCNCA, Terzić et al. 2023, §2, Fig. 1b-c, Appendix E).

D residual blocks; block i holds B depthwise convolutions of K taps with dilation f^i, each
followed by the activation, and adds its input back: x <- x + act(conv_B(... act(conv_1(x)))).
Causal blocks look back only (left padding); bidirectional ones are centred. The output at i
depends on a window of

    receptive_field = 1 + B (K - 1) (f^D - 1) / (f - 1)      (f = 1: 1 + B (K - 1) D)

inputs. ``dilation_factor="auto"`` grows f with each input's length until that window covers the
sequence, as the paper's runtime study does (Appendix H); ``receptive_field=R`` fixes f once, the
smallest f whose window reaches R. Cost O(n d D B K), linear in the length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import nn

from ..fields import Choice, Integer, setting
from ..ops.activations import ACTIVATIONS, get_activation
from ..ops.dilated import causal_dilated_chunk, dilated_conv
from ..options import Options
from ..state import StreamState
from ..validation import check_int
from .base import PADDING_SIDES, ChannelSliced, Mixer, zero_padding
from .registry import register_mixer


def receptive_field(kernel_size: int, dilation_factor: int, depth: int, convs_per_block: int = 1) -> int:
    """1 + B (K - 1) (f^D - 1) / (f - 1): inputs one TCN output depends on (Appendix E)."""
    reach = depth if dilation_factor == 1 else (dilation_factor**depth - 1) // (dilation_factor - 1)
    return 1 + convs_per_block * (kernel_size - 1) * reach


def dilation_for(target: int, kernel_size: int, depth: int, convs_per_block: int = 1) -> int:
    """The smallest dilation factor f >= 1 whose receptive field is >= ``target``."""
    check_int(target, "receptive_field")
    if kernel_size == 1:
        if target > 1:
            raise ValueError(f"kernel_size=1 sees one token; receptive_field={target} is out of reach")
        return 1
    factor = 1
    while receptive_field(kernel_size, factor, depth, convs_per_block) < target:
        factor += 1
    return factor


@dataclass
class TcnState(StreamState):
    """Per convolution, its last (K - 1) * dilation inputs, (batch, span, dim): the same size at every position.

    ``factor`` is the dilation factor streamed; ``limit`` the longest stream it is valid for
    (``dilation_factor="auto"`` chose it for ``max_length``), None when fixed.
    """

    histories: list
    factor: int
    position: int = 0
    limit: int | None = None


@dataclass
class TcnOptions(Options):
    kernel_size: int = setting(5, Integer(1), "taps K of each depthwise dilated convolution")
    dilation_factor: int | str = setting(
        4, Integer(1, words=("auto",)), 'f: block i dilates by f^i; "auto" grows f with each input until the receptive field covers it'
    )
    depth: int = setting(4, Integer(1), "residual blocks D")
    convs_per_block: int = setting(1, Integer(1), "B convolutions per block (the paper's choice is 1)")
    receptive_field: int | None = setting(None, Integer(1, optional=True), "fix f as the smallest factor reaching this many tokens")
    activation: str = setting("gelu", Choice(sorted(ACTIVATIONS)), "after each convolution (identity strips it)")


@register_mixer("tcn")
class Tcn(ChannelSliced, Mixer):
    """Dilated depthwise TCN (name ``tcn``); see the module docstring for the options."""

    options_type = TcnOptions
    no_weight_decay = ("taps", "bias")
    bounded_state = True  # the receptive field's last inputs per layer
    static_decoding = True
    inner_precision = "input"  # the depthwise convolution takes one dtype for input and taps

    def __init__(self, dim: int, causal: bool = False, options: TcnOptions | None = None):
        super().__init__(dim, causal, options)
        kernel_size, depth, convs_per_block = self.options.kernel_size, self.options.depth, self.options.convs_per_block
        self.kernel_size, self.depth, self.convs_per_block = kernel_size, depth, convs_per_block
        dilation_factor = self.options.dilation_factor
        if self.options.receptive_field is not None:
            dilation_factor = dilation_for(self.options.receptive_field, kernel_size, depth, convs_per_block)
        self.dilation_factor = dilation_factor
        self.act = get_activation(self.options.activation)
        self.min_lag = 0 if self.causal else -(kernel_size // 2)
        convs = depth * convs_per_block
        bound = 1.0 / math.sqrt(kernel_size)  # PyTorch's conv default: fan-in K per channel
        self.taps = nn.Parameter(torch.empty(convs, dim, kernel_size).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(convs, dim).uniform_(-bound, bound))

    def factor_for(self, n: int) -> int:
        """The dilation factor used at length n."""
        if self.dilation_factor == "auto":
            return dilation_for(n, self.kernel_size, self.depth, self.convs_per_block)
        return self.dilation_factor

    @property
    def padding_invariant_sides(self) -> tuple[str, ...]:
        """Both with a fixed dilation (padding is zeroed before every convolution); none with ``dilation_factor="auto"``."""
        return () if self.dilation_factor == "auto" else PADDING_SIDES

    front_padding_period = 1  # a stream fixes its dilation (``max_length``) and its histories start as zeros: padding adds more zeros

    @property
    def receptive_field(self) -> int | None:
        """Inputs one output depends on (None with ``dilation_factor="auto"``: see ``factor_for``)."""
        if self.dilation_factor == "auto":
            return None
        return receptive_field(self.kernel_size, self.dilation_factor, self.depth, self.convs_per_block)

    @property
    def reach(self) -> tuple[int, int] | None:
        """Summed over the convolutions: lags min_lag .. min_lag + K - 1 times each one's dilation (None with "auto")."""
        if self.dilation_factor == "auto":
            return None
        dilations = sum(self.dilation_factor**block for block in range(self.depth)) * self.convs_per_block
        return (self.min_lag + self.kernel_size - 1) * dilations, -self.min_lag * dilations

    def mix_channels(self, x: torch.Tensor, mask: torch.Tensor | None, channels: slice) -> torch.Tensor:
        """Padding is zeroed before every convolution: a bias must not carry it to real tokens."""
        factor = self.factor_for(x.shape[1])
        taps, bias = self.taps[:, channels].to(x.dtype), self.bias[:, channels].to(x.dtype)
        for block in range(self.depth):
            h = x
            for conv in range(block * self.convs_per_block, (block + 1) * self.convs_per_block):
                h = self.act(dilated_conv(zero_padding(h, mask), taps[conv], factor**block, self.min_lag) + bias[conv])
            x = x + h
        return zero_padding(x, mask)

    state_type = TcnState

    def empty_state(self, batch_size: int, device, dtype: torch.dtype, max_length: int | None) -> TcnState:
        if self.dilation_factor == "auto" and max_length is None:
            raise ValueError(
                "a tcn with dilation_factor='auto' sets its dilation from the length: stream it with init_state(..., max_length=...)"
            )
        factor = self.factor_for(max_length) if self.dilation_factor == "auto" else self.dilation_factor
        spans = [(self.kernel_size - 1) * factor ** (conv // self.convs_per_block) for conv in range(self.depth * self.convs_per_block)]
        histories = [torch.zeros(batch_size, span, self.dim, device=device, dtype=dtype) for span in spans]
        return TcnState(histories, factor, 0, max_length if self.dilation_factor == "auto" else None)

    def static_state(self, state: TcnState, capacity: int) -> TcnState:
        """The histories copied, the position not counted (rows at any positions then share a batch); a capacity past
        the length an automatic dilation was chosen for is refused (``Mixer.static_state``)."""
        if state.limit is not None and capacity > state.limit:
            raise ValueError(f"this stream's dilation was chosen for max_length={state.limit}: capacity must stay within, got {capacity}")
        return replace(super().static_state(state, capacity), position=0)

    def step_chunk(self, x: torch.Tensor, state: TcnState, mask) -> tuple[torch.Tensor, TcnState]:
        """Each convolution on its history and the chunk: O(depth B K k d), whatever the position."""
        end = state.position + x.shape[1]
        if state.limit is not None and end > state.limit:
            raise ValueError(f"this stream's dilation was chosen for max_length={state.limit} tokens; it cannot go on to {end}")
        taps, bias = self.taps.to(x.dtype), self.bias.to(x.dtype)
        histories = []
        for block in range(self.depth):
            h = x
            for conv in range(block * self.convs_per_block, (block + 1) * self.convs_per_block):
                convolved, history = causal_dilated_chunk(zero_padding(h, mask), state.histories[conv], taps[conv], state.factor**block)
                histories.append(history)
                h = self.act(convolved + bias[conv])
            x = x + h
        return zero_padding(x, mask), TcnState(histories, state.factor, end, state.limit)

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, causal={self.causal}, kernel_size={self.kernel_size}, dilation_factor={self.dilation_factor}, "
            f"depth={self.depth}, convs_per_block={self.convs_per_block}, receptive_field={self.receptive_field}"
        )
