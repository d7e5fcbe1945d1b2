"""Streaming for the causal Toeplitz mixers (tno, ski_tno, fd_tno): exact decoding in O(L log^2 L).

A causal Toeplitz mixer is y_t = sum_{s <= t} t_{t-s} x_s with taps t_k by lag. Decoding runs the
relaxed tiled product of ``ops/online_toeplitz.py`` (Flash Inference, Oncescu et al., arXiv
2410.12982, §3) on taps computed once per power-of-two number of lags and cached until the
weights change. A chunk at the start of the stream (a prompt) or of at least ``PARALLEL_CHUNK``
tokens runs the parallel FFT product instead and rebuilds the state from the inputs, exactly as
if they had been stepped one by one.

Decoding from static buffers (``static_state``, ``static_step``: a CUDA graph replays the step at every
position) takes the direct product instead, y_t = sum_{s <= t} t_{t-s} x_s over a history buffer of the
stream's whole capacity C (zeros past t), the same kernels at every position (``ops/history_toeplitz.py``):
one fused kernel reading the live history, O(t d) per token, where the fused kernels run; else PyTorch's
gather over the whole buffer, O(C d).

A mixer whose taps depend on the sequence length (``fd_tno``: the RPE is evaluated on the FFT
grid of the length) streams the operator of a horizon: ``max_length`` when given, else
``DEFAULT_HORIZON``; a stream that passes its horizon doubles it and rebuilds its state from the
inputs with the finer grid's taps, so each output equals one forward over the horizon in force.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..ops.fft import spectral_dtype
from ..ops.history_toeplitz import history_product
from ..ops.online_toeplitz import OnlineToeplitzState, TileKernels, empty_state, online_step, padded_state, prefill_state, required_lags
from ..ops.toeplitz import fused_wanted, toeplitz_matvec
from ..state import StreamState
from .cache import Cache

PARALLEL_CHUNK = 32  # chunks this long (or a stream's first) take the parallel path: its O(t log t) beats k online steps
DEFAULT_HORIZON = 1024
HORIZONS_KEPT = 4  # taps kept for this many horizons: streams of different horizons stepping in turn reuse theirs


@dataclass
class ToeplitzStreamState(StreamState):
    """The online product's state and the horizon whose operator the stream applies."""

    online: OnlineToeplitzState
    horizon: int


@dataclass
class StaticToeplitzState(StreamState):
    """A stream in fixed buffers: every input so far in ``inputs`` (batch, capacity, dim), zeros past each row's
    ``position`` (batch,), and the horizon whose operator it applies."""

    inputs: torch.Tensor
    position: torch.Tensor
    horizon: int


class ToeplitzStreaming:
    """Mixin of causal mixers given by taps ``stream_taps(lags, horizon)`` (lags 0 ... lags - 1, (lags, dim))."""

    state_type = ToeplitzStreamState
    channelwise_linear = True
    toeplitz_streaming = True
    static_decoding = True
    taps_depend_on_length = False  # True: the taps change with the horizon (see the module docstring)
    front_padding_period = 1  # the streamed operator is a Toeplitz one (lags only) while the stream stays within its horizon

    def stream_taps(self, lags: int, horizon: int) -> torch.Tensor:
        return self.kernel(lags)

    def state_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return spectral_dtype(dtype)

    def empty_state(self, batch_size: int, device, dtype: torch.dtype, max_length: int | None) -> ToeplitzStreamState:
        return ToeplitzStreamState(empty_state(batch_size, self.dim, device=device, dtype=dtype), max_length or DEFAULT_HORIZON)

    def after_padding(self, state: ToeplitzStreamState, padding: torch.Tensor) -> ToeplitzStreamState:
        """Zero inputs leave a zero history: the online state at the padding's end, nothing computed."""
        inputs = state.online.inputs
        online = padded_state(inputs.shape[0], inputs.shape[2], padding.shape[1], device=inputs.device, dtype=inputs.dtype)
        return ToeplitzStreamState(online, state.horizon)

    def _tile_kernels(self, lags: int, horizon: int, device, dtype: torch.dtype) -> TileKernels:
        """Taps for at least ``lags`` lags, cached (by power of two) while the weights and horizon stay
        (a mixin without ``__init__``: the cache is made on first use)."""
        capacity = 64
        while capacity < lags:
            capacity *= 2
        if self.taps_depend_on_length:
            capacity = max(lags, min(capacity, 2 * horizon))
        key = (horizon if self.taps_depend_on_length else None, str(device), dtype)
        if "_stream_kernels" not in self.__dict__:
            self.__dict__["_stream_kernels"] = Cache(HORIZONS_KEPT)
        return self.__dict__["_stream_kernels"].get(
            key,
            lambda: TileKernels(self.stream_taps(capacity, horizon).to(device, dtype)),
            weights=self,
            usable=lambda kernels: len(kernels) >= lags,
        )

    def step_chunk(self, x: torch.Tensor, state: ToeplitzStreamState, mask) -> tuple[torch.Tensor, ToeplitzStreamState]:
        online, horizon = state.online, state.horizon
        start, count = online.position, x.shape[1]
        end = start + count
        work = x.to(online.inputs.dtype)
        if self.taps_depend_on_length and end > horizon:
            while horizon < end:
                horizon *= 2
            kernels = self._tile_kernels(required_lags(max(start - 1, 0)), horizon, x.device, work.dtype)
            online = prefill_state(online.inputs[:, :start], kernels)
        if start == 0 or count >= PARALLEL_CHUNK:
            inputs = torch.cat([online.inputs[:, :start], work], dim=1)
            kernels = self._tile_kernels(required_lags(end - 1), horizon, x.device, work.dtype)
            y = toeplitz_matvec(inputs, kernels.taps[:end], causal=True)[:, start:]
            online = prefill_state(inputs, kernels)
        else:
            kernels = self._tile_kernels(required_lags(end - 1), horizon, x.device, work.dtype)
            y = torch.stack([online_step(online, work[:, i], kernels) for i in range(count)], dim=1)
        return y.to(x.dtype), ToeplitzStreamState(online, horizon)

    def static_state(self, state: ToeplitzStreamState, capacity: int) -> StaticToeplitzState:
        """The stream's inputs so far in a (batch, ``capacity``, dim) buffer (``Mixer.static_state``)."""
        online, horizon = state.online, state.horizon
        if capacity < online.position:
            raise ValueError(f"capacity must hold the {online.position} tokens the stream has read, got {capacity}")
        if self.taps_depend_on_length and capacity > horizon:
            raise ValueError(f"capacity must stay within the stream's horizon ({horizon}: its taps are that length's), got {capacity}")
        inputs = online.inputs.new_zeros(online.inputs.shape[0], capacity, self.dim)
        inputs[:, : online.position] = online.inputs[:, : online.position]
        position = torch.full((inputs.shape[0],), online.position, dtype=torch.long, device=inputs.device)
        return StaticToeplitzState(inputs, position, horizon)

    def static_step(self, x: torch.Tensor, state: StaticToeplitzState) -> torch.Tensor:
        """y_t = sum_s t_{t-s} x_s over the whole buffer, x written at each row's position t first (``Mixer.static_step``)."""
        return self.in_inner_precision(self._direct_step, x, state)

    def static_taps(self, capacity: int, horizon: int, device, dtype: torch.dtype) -> torch.Tensor:
        """Taps for lags 0 ... capacity - 1, cached apart from the stream's tiles (which a longer stream replaces) while
        the weights stay: a CUDA graph of the static step reads them for as long as it lives."""
        if "_static_taps" not in self.__dict__:
            self.__dict__["_static_taps"] = Cache(HORIZONS_KEPT)
        key = (capacity, horizon if self.taps_depend_on_length else None, str(device), dtype)
        return self.__dict__["_static_taps"].get(key, lambda: self.stream_taps(capacity, horizon).to(device, dtype), weights=self)

    def _direct_step(self, x: torch.Tensor, state: StaticToeplitzState) -> torch.Tensor:
        inputs = state.inputs
        taps = self.static_taps(inputs.shape[1], state.horizon, x.device, inputs.dtype)
        y = history_product(inputs, state.position, x[:, 0], taps, fused=fused_wanted(inputs))
        state.position += 1
        return y[:, None].to(x.dtype)
