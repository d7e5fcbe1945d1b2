"""The mixer contract: (batch, length, dim) -> same shape and dtype, optional padding mask."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..ops.toeplitz import naive_toeplitz_matrix
from ..options import Options
from ..precision import run_in_inner_precision
from ..state import StreamState, check_state
from ..validation import check_finite, check_int, finite_checks_enabled
from .parts import Configurable


def check_sequence(x: torch.Tensor, dim: int, mask: torch.Tensor | None) -> None:
    """ValueError unless x is (batch, length >= 1, dim) floating point and mask is bool (batch, length)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must be a (batch, length, dim) tensor, got {shape}")
    if x.shape[1] < 1:
        raise ValueError("x must have length >= 1")
    if x.shape[2] != dim:
        raise ValueError(f"x has {x.shape[2]} channels but the mixer was built with dim={dim}")
    if not x.is_floating_point():
        raise ValueError(f"x must be a floating point tensor, got dtype {x.dtype}")
    check_mask(mask, tuple(x.shape[:2]))


def check_mask(mask, shape: tuple[int, int]) -> None:
    """ValueError unless mask is None or a bool tensor of ``shape`` (batch, length)."""
    if mask is None:
        return
    if not isinstance(mask, torch.Tensor):
        raise ValueError(
            f"mask must be a bool torch.Tensor of shape (batch, length) = {shape}, True at real tokens; got {type(mask).__name__}"
        )
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor (True at real tokens), got dtype {mask.dtype}")
    if tuple(mask.shape) != shape:
        raise ValueError(f"mask must have shape (batch, length) = {shape}, got {tuple(mask.shape)}")


def zero_padding(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Zero the padded positions so they cannot reach real tokens."""
    return x if mask is None else x.masked_fill(~mask[..., None], 0.0)


PADDING_SIDES = ("left", "right")
SEQUENCE_SPLITS = ("halo", "channels", "heads", "body")  # the ways ``Mixer.sequence_split`` names


def common_padding_sides(parts) -> tuple[str, ...]:
    """The sides on which padding leaves every one of ``parts`` as it is alone (see ``Mixer.padding_invariant_sides``)."""
    declared = [set(part.padding_invariant_sides) for part in parts]
    return tuple(side for side in PADDING_SIDES if all(side in sides for sides in declared))


def common_front_padding_period(parts) -> int | None:
    """The least front padding period of all ``parts`` (see ``Mixer.front_padding_period``): the lcm of
    theirs, None when one of them has none."""
    periods = [part.front_padding_period for part in parts]
    return None if None in periods else math.lcm(1, *periods)


class Mixer(Configurable, nn.Module):
    """Base class: validates input, zeros padding, then calls ``mix(x, mask)`` on (batch, length, dim).

    ``mix`` receives x with padded positions already zero and the mask (None when every token is
    real); it returns x's shape and dtype. An empty batch never reaches it.

    Streaming (causal mixers): ``state = init_state(batch_size)``, then ``y, state = step(x, state)``
    for chunks x (batch, k, dim) of any sizes k >= 1; the outputs are those of one ``forward`` over
    the whole sequence. A mixer streams by defining ``state_type``, ``empty_state`` and
    ``step_chunk`` (x with padding zeroed, the validated state -> y, state); ``step_chunk`` may
    update the state in place.

    Padding: whatever its content, padding never reaches a real token (it is zeroed before ``mix``).
    Whether a padded sequence's real outputs are those of the sequence alone depends on the operator:
    on both sides when it depends on the lags between tokens only, on the right only when it also
    follows positions counted from the first token (chunk boundaries, Fourier phases), on neither
    when it depends on the length (an FFT or inducing grid, a 2-D layout, an automatic dilation).
    ``padding_invariant_sides`` says which.
    """

    # -- capabilities: what blocks, models, generation and bench ask of a mixer --------------------
    fft_based = False
    causal_modes: tuple[bool, ...] = (False, True)  # the values of ``causal`` the mixer supports
    padding_invariant_sides: tuple[str, ...] = ()
    """Sides ("left", "right") on which padding a sequence leaves the outputs at its real tokens those of the sequence alone."""

    @property
    def front_padding_period(self) -> int | None:
        """Streaming (causal mixers): a stream that starts with a multiple of this many padded (masked)
        positions gives its real tokens the outputs of the stream alone, made for the same
        ``max_length`` and not passing it; None when no padding does. Rows of different lengths can
        then share one batched state, right-aligned (the server's continuous batching). 1 where left
        padding leaves the operator as it is; a mixer counting positions from the first token (chunk
        boundaries, DFT rows) gives its period."""
        return 1 if "left" in self.padding_invariant_sides else None

    token_axes = 1
    """1: tokens form a sequence; 2: a grid (H, W) flattened row by row."""
    sequence_axis = 1  # of x (batch, length, dim): where context parallelism splits it
    channelwise_linear = False
    """Each channel's outputs are a fixed linear map of that channel's inputs: a (dim, n, n) operator."""
    channel_slices = False
    """Has ``mix_channels(x, mask, channels)``: some of its channels mixed from those channels alone."""
    bounded_state = False
    """Streaming: the state keeps one size at every position (a window, a chunk, a recurrence) instead of
    growing. Read it on an instance: options may decide it (``attention`` with a ``chunk_size``)."""
    toeplitz_streaming = False
    """Streams by the online product with its taps ``kernel(n)``: decoding can be checked against the direct product."""
    mixes_context = False
    """Has ``mix_context(x, context, key_mask, start)``: the newest tokens mixed with a context of earlier ones
    ending with them, the memory a Transformer-XL block keeps (causal mixers only)."""
    static_context = False
    """Has ``mix_static_context(x, context, key_mask, positions)``: ``mix_context`` for one token per row, from a context of
    fixed length and stream positions (batch,) read on the device; a Transformer-XL block around it decodes from
    static buffers."""
    normalize_output = False
    """Its outputs are sums that grow with its reach: a Transformer-XL block normalizes them (FNet's post-Fourier LayerNorm)."""
    inner_precision = "autocast"
    """Under a caller's autocast (mixed precision), how ``mix`` and ``step`` run: "autocast" (its products in the
    compute dtype), "float32" (autocast off, on the input cast to float32: FFT products, kernels over long lags) or
    "input" (autocast off, in the input's dtype); the output keeps the input's dtype (``tokenmix.precision``)."""

    @property
    def channel_independent(self) -> bool:
        """Each output channel depends on the same input channel only: every channelwise linear mixer, and
        those that mix a slice of channels from those channels alone (``channel_slices``)."""
        return self.channelwise_linear or self.channel_slices

    @property
    def reach(self) -> tuple[int, int] | None:
        """(behind, ahead): how many tokens before and after a position its output may depend on, where
        finite (the receptive field is behind + 1 + ahead); None when any token may reach any other."""
        return None

    @property
    def sequence_split(self) -> str | None:
        """How the mixer runs on a sequence split into contiguous shards, one per process (context
        parallelism, ``tokenmix.parallel``):

        - ``"halo"``: a finite ``reach``; each shard reads the inputs ``halo_span`` names from its neighbours;
        - ``"channels"``: ``channel_slices``; exchanged from sequence shards to channel shards
          (all-to-all), each process mixes whole sequences of dim / P channels (``mix_channels``);
        - ``"heads"``: attention with independent heads, exchanged to head shards (all-to-all, Ulysses),
          or, where P does not divide the heads, ring attention (the core's ``rotate``, ``attend_block``);
        - ``"body"``: token-wise around parts that split their own way (full attention: its heads);
        - None: it cannot be split.
        """
        if self.reach is not None:
            return "halo"
        return "channels" if self.channel_slices else None

    def halo_span(self, start: int, stop: int, length: int) -> tuple[int, int]:
        """(begin, end): the inputs from which a forward over them alone gives the outputs [start, stop)
        of a forward over the whole sequence of ``length`` tokens (``"halo"`` split). Here the reach
        around the outputs, for operators of lags only (padding invariant on both sides); mixers that
        count positions from the first token (chunk boundaries, DFT rows) widen it to their grid."""
        behind, ahead = self.reach
        return max(0, start - behind), min(length, stop + ahead)

    def mix_channels(self, x: torch.Tensor, mask: torch.Tensor | None, channels: slice) -> torch.Tensor:  # pragma: no cover
        """Channels ``channels`` of ``mix``'s output, from x (batch, length, those channels) alone (``channel_slices``)."""
        raise NotImplementedError

    def __init__(self, dim: int, causal: bool, options: Options | None = None):
        super().__init__()
        check_int(dim, "dim")
        if not isinstance(causal, bool):
            raise ValueError(f"causal must be True or False, got {causal!r}")
        self.dim = dim
        self.causal = causal
        self.take_options(options, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.checked_mix(x, mask)

    def checked_mix(self, x: torch.Tensor, mask: torch.Tensor | None, **mix_options) -> torch.Tensor:
        """Validate, zero the padding, then ``mix``; ``mix_options`` reach the ``mix`` of mixers whose
        ``forward`` takes per-call options (a 2-D mixer's ``grid``)."""
        check_sequence(x, self.dim, mask)
        if finite_checks_enabled():
            check_finite(x, mask)
        if x.shape[0] == 0:
            return x * 0  # nothing to mix; keeps the autograd graph
        return self.in_inner_precision(self.mix, zero_padding(x, mask), mask, **mix_options)

    def in_inner_precision(self, function, x: torch.Tensor, *args, **kwargs):
        """``function(x, ...)`` (this mixer's ``mix``, ``step_chunk``, ``mix_channels`` or ``mix_context``) in its
        ``inner_precision``, the result in x's dtype."""
        return run_in_inner_precision(self.inner_precision, function, x, *args, **kwargs)

    def mix(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    # -- streaming ------------------------------------------------------------------------------
    state_type: type[StreamState] | None = None

    def state_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype a state for inputs of ``dtype`` holds (FFT-based mixers: their spectral dtype)."""
        return dtype

    def init_state(
        self, batch_size: int, *, max_length: int | None = None, device=None, dtype: torch.dtype | None = None, masked: int = 0
    ) -> StreamState:
        """The state before the first token, for inputs of ``dtype`` (default: the parameters' dtype).

        ``max_length``: the longest stream expected; mixers whose operator depends on the sequence
        length (``fd_tno``'s frequency grid, ``tcn``'s ``dilation_factor="auto"``) then equal one
        forward over that many tokens. Others ignore it.
        ``masked``: the stream starts with this many masked (padding) positions, which need not be
        read: the state is the one stepping them would leave (``after_padding``).
        """
        if not self.causal:
            raise ValueError(f"{type(self).__name__} was built with causal=False; only causal mixers stream (build it with causal=True)")
        check_int(batch_size, "batch_size", minimum=0)
        if max_length is not None:
            check_int(max_length, "max_length")
        if dtype is None:
            dtype = next(self.parameters(), torch.empty(0)).dtype
        if not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating point dtype, got {dtype}")
        if device is None:
            device = next(self.parameters(), torch.empty(0)).device
        check_int(masked, "masked", minimum=0)
        state = self.empty_state(batch_size, torch.device(device), self.state_dtype(dtype), max_length)
        return self.after_padding(state, torch.zeros(batch_size, masked, self.dim, device=device, dtype=dtype)) if masked else state

    def after_padding(self, state: StreamState, padding: torch.Tensor) -> StreamState:
        """The empty ``state`` after ``padding`` (batch, count, dim): zeros, every position masked. Here by
        stepping them; a mixer whose state after padding is plain (zeros at a position) builds it at once."""
        return self.step_chunk(padding, state, torch.zeros(padding.shape[:2], dtype=torch.bool, device=padding.device))[1]

    def step(self, x: torch.Tensor, state: StreamState, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, StreamState]:
        """The outputs for the next chunk x (batch, k, dim) of the stream, and the state after it."""
        check_sequence(x, self.dim, mask)
        return self.in_inner_precision(self._checked_step, zero_padding(x, mask), state, mask)

    def _checked_step(self, x: torch.Tensor, state: StreamState, mask: torch.Tensor | None) -> tuple[torch.Tensor, StreamState]:
        """``step_chunk`` after checking the state against x as the mixer computes on it (float32 under autocast
        for an ``inner_precision`` of "float32"). Under autocast a mixer of the "autocast" kind reads x in the dtype
        its state holds: the ops choose the activations' dtypes there, while a stream keeps the one it was made in."""
        dtypes = state.floating_dtypes if isinstance(state, StreamState) else set()
        if self.inner_precision == "autocast" and torch.is_autocast_enabled(x.device.type) and len(dtypes) == 1:
            x = x.to(*dtypes)
        check_state(state, self.state_type, x.shape[0], self.state_dtype(x.dtype), f"this {self.dim}-channel {type(self).__name__}")
        return self.step_chunk(x, state, mask)

    # -- decoding from static buffers (CUDA graphs) ------------------------------------------------
    static_decoding = False
    """Decodes from fixed buffers (``static_state``, ``static_step``): one token a call, the same kernels at every
    position and nothing read back from the device, so a CUDA graph of the step replays at every position
    (``tokenmix.generation.graphs``). Here for a ``bounded_state`` whose tensors keep their shapes from token to token."""

    def static_state(self, state: StreamState, capacity: int) -> StreamState:
        """A stream's ``state`` in buffers that carry it on to ``capacity`` tokens in all, for ``static_step``; here a
        copy (a bounded state needs no more room)."""
        check_static_decoding(self)
        return state.to()

    def static_step(self, x: torch.Tensor, state: StreamState) -> torch.Tensor:
        """The output for the next token x (batch, 1, dim), ``state`` (``static_state``'s) updated in place. Here
        ``step_chunk``, its new state copied into the old one's buffers (its other fields, a position, stay)."""
        y, new = self.in_inner_precision(self._checked_step, x, state, None)
        state.copy_(new)
        return y

    def empty_state(
        self, batch_size: int, device: torch.device, dtype: torch.dtype, max_length: int | None
    ) -> StreamState:  # pragma: no cover
        raise NotImplementedError

    def step_chunk(
        self, x: torch.Tensor, state: StreamState, mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, StreamState]:  # pragma: no cover
        raise NotImplementedError

    def extra_repr(self) -> str:
        return f"dim={self.dim}, causal={self.causal}"


def check_static_decoding(part) -> None:
    """ValueError unless ``part`` (a mixer, block or model) decodes from static buffers (``Mixer.static_decoding``)."""
    if not part.static_decoding:
        raise ValueError(
            f"{type(part).__name__} does not decode from static buffers (static_decoding=False): decode it with step(), "
            "or generate with decoding='stream'"
        )


class ChannelSliced:
    """Mixin of mixers that mix each channel on its own and can compute a slice of them (``mix_channels``):
    ``mix`` is the slice of every channel."""

    channel_slices = True

    def mix(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return self.mix_channels(x, mask, slice(None))


class ToeplitzOperator:
    """Mixin of mixers whose operator is one Toeplitz matrix per channel, given by ``kernel(n)`` by lag."""

    def operator_matrices(self, n: int, channels: slice = slice(None)) -> dict[str, torch.Tensor]:
        """Named explicit (channels, n, n) matrices of the operator at length n (tests and plots)."""
        return {"T": naive_toeplitz_matrix(self.kernel(n)[:, channels], n, self.causal)}
