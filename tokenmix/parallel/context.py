"""Context parallelism: each process of a group runs the model on one contiguous shard of the sequence.

Everything but token mixing works token by token, so a block's body runs on the shard unchanged;
``ContextRun`` is the ``run`` its body calls wherever a part mixes tokens, and splits that part the
way it declares (``Mixer.sequence_split``), exactly (the numbers of one process, to rounding):

- ``"halo"``: the inputs ``part.halo_span(start, stop, length)`` names are gathered from the shards
  holding them (one all-to-all, so a reach longer than a shard reads several), the part runs on
  them alone and the outputs [start, stop) are kept;
- ``"channels"``: all-to-all from sequence shards to channel shards; the part mixes whole sequences
  of its dim / P channels (``mix_channels``: kernels of those channels only) and an all-to-all
  returns them (as Savanna does for long convolutions, arXiv 2503.01868);
- ``"heads"``: attention's q, k, v go to head shards, each process attends whole sequences of its
  heads, and the outputs come back (DeepSpeed-Ulysses, arXiv 2309.14509); heads that P does not
  divide attend by ring attention (``ring.py``): keys and values pass from process to process;
- ``"body"``: a block (or full attention) whose own work is token-wise: its body runs on the shard
  with this same ``run`` for its parts.

Every process holds the batch's padding mask (a bit per token), so spans of the mask need no exchange;
of the tokens it needs only its shard's (a training step reads no others: ``ContextParallel(tokens,
length=...)``), and activations exist only for the shard, its halo, or its channel or head share.
"""

from __future__ import annotations

import torch
from torch import nn

from ..mixers.base import check_mask, zero_padding
from ..models.model import SequenceModel, pooling_weights
from ..precision import run_in_inner_precision
from .exchange import exchange
from .ring import ring_attention
from .shards import ContextShard, shard_bounds


def _packed(h) -> tuple[torch.Tensor, list[int] | None]:
    """One tensor for a tensor or a tuple of tensors alike but in their last dimension (attention's q, k, v)."""
    return (torch.cat(h, dim=-1), [part.shape[-1] for part in h]) if isinstance(h, tuple) else (h, None)


def _unpacked(x: torch.Tensor, widths: list[int] | None):
    return x if widths is None else tuple(x.split(widths, dim=-1))


def _resized(shape, sizes: dict[int, int]) -> tuple[int, ...]:
    return tuple(sizes.get(axis, size) for axis, size in enumerate(shape))


class ContextRun:
    """``run(part, h)`` for a block's body on the shard ``shard`` of a batch whose whole (batch, length)
    padding mask is ``mask`` (None: every token real); ``tokens_given_whole``: whether the tokens passed to
    the model are whole sequences (else only the shard's)."""

    def __init__(self, shard: ContextShard, mask: torch.Tensor | None, tokens_given_whole: bool = True):
        self.shard, self.mask = shard, None if mask is None else mask.flatten(0, -2)  # the dual encoder's documents are rows
        self.tokens_given_whole = tokens_given_whole
        self.strategies = {"body": self.body, "halo": self.halo, "channels": self.channels, "heads": self.heads}

    def local(self, t: torch.Tensor | None) -> torch.Tensor | None:
        """This shard's positions of a (batch, length) tensor."""
        return None if t is None else t[:, self.shard.start : self.shard.stop]

    def tokens_of(self, tokens: torch.Tensor) -> torch.Tensor:
        """This shard's tokens, of the tokens the model was given."""
        return self.local(tokens) if self.tokens_given_whole else tokens

    def pool(self, h: torch.Tensor, how: str) -> torch.Tensor:
        """``pool_hidden`` of the whole sequence: this shard's weighted sum of its hidden states (batch, n, dim),
        the sums of every shard added (each process sends its sum to every other; all add them in rank order)."""
        shard = self.shard
        weights = self.local(pooling_weights(self.mask, (h.shape[0], shard.length), how, h.dtype, h.device))
        partial = torch.einsum("bn,bnd->bd", weights, h)
        return torch.stack(exchange([partial] * shard.size, [partial.shape] * shard.size, shard.group)).sum(dim=0)

    def mask_of(self, begin: int, end: int) -> torch.Tensor | None:
        return None if self.mask is None else self.mask[:, begin:end]

    def __call__(self, part, h):
        return self.strategies[part.sequence_split](part, h)

    def body(self, part, h):
        return part.body(h, self.mask_of(self.shard.start, self.shard.stop), self)

    def halo(self, part, h):
        """Gather the inputs of ``part.halo_span``, run the part on them, keep the shard's outputs."""
        shard, axis = self.shard, part.sequence_axis
        x, widths = _packed(h)
        gathered, (begin, end) = self.span(x, part.halo_span, axis)
        y = part(_unpacked(gathered, widths), self.mask_of(begin, end))
        return y.narrow(axis, shard.start - begin, shard.stop - shard.start)

    def span(self, x: torch.Tensor, span_of, axis: int = 1) -> tuple[torch.Tensor, tuple[int, int]]:
        """(inputs, (begin, end)): the positions [begin, end) = ``span_of(start, stop, length)`` of the sequence
        whose shard ``x`` holds along ``axis`` (every process asks for its own span), gathered from the
        shards holding them in one exchange."""
        shard = self.shard
        spans = [span_of(start, stop, shard.length) for start, stop in shard.bounds]
        (begin, end), (start, stop) = spans[shard.rank], (shard.start, shard.stop)

        def overlap(span, bounds) -> tuple[int, int]:
            """Their common [low, high), empty (low = high) within ``bounds`` when they do not meet."""
            low = min(max(span[0], bounds[0]), bounds[1])
            return low, max(low, min(span[1], bounds[1]))

        sent = [overlap(span, (start, stop)) for span in spans]
        pieces = [x.narrow(axis, low - start, high - low) for low, high in sent]
        received = [overlap((begin, end), bounds) for bounds in shard.bounds]
        shapes = [_resized(x.shape, {axis: high - low}) for low, high in received]
        return torch.cat(exchange(pieces, shapes, shard.group), dim=axis), (begin, end)

    def channels(self, part, x: torch.Tensor) -> torch.Tensor:
        """Sequence shards -> channel shards, ``mix_channels`` over the whole length, and back."""
        shard = self.shard
        channel_bounds = shard_bounds(x.shape[-1], shard.size)
        low, high = channel_bounds[shard.rank]
        shapes = [(x.shape[0], stop - start, high - low) for start, stop in shard.bounds]
        whole = torch.cat(exchange([x[..., a:b] for a, b in channel_bounds], shapes, shard.group), dim=1)
        mask = self.mask_of(0, shard.length)
        y = run_in_inner_precision(part.inner_precision, part.mix_channels, zero_padding(whole, mask), mask, slice(low, high))
        shapes = [(x.shape[0], shard.stop - shard.start, b - a) for a, b in channel_bounds]
        return torch.cat(exchange([y[:, start:stop] for start, stop in shard.bounds], shapes, shard.group), dim=-1)

    def heads(self, part, qkv):
        """Attention's (q, k, v) (batch, heads, n, width) to head shards, attended over the whole length, and
        back; heads the processes cannot share evenly attend by ``ring_attention`` instead."""
        shard = self.shard
        if qkv[0].shape[1] % shard.size:
            return ring_attention(part, qkv, shard, self.mask)
        x, widths = _packed(qkv)
        head_bounds = shard_bounds(x.shape[1], shard.size)
        low, high = head_bounds[shard.rank]
        shapes = [_resized(x.shape, {1: high - low, 2: stop - start}) for start, stop in shard.bounds]
        whole = torch.cat(exchange([x[:, a:b] for a, b in head_bounds], shapes, shard.group), dim=2)
        y = part(_unpacked(whole, widths), self.mask_of(0, shard.length))
        shapes = [_resized(y.shape, {1: b - a, 2: shard.stop - shard.start}) for a, b in head_bounds]
        return torch.cat(exchange([y[:, :, start:stop] for start, stop in shard.bounds], shapes, shard.group), dim=1)


def split_problems(part, processes: int) -> list[str]:
    """Why ``part`` (a block, or a part of one) cannot run split over ``processes`` processes; empty when it can."""
    split, name = part.sequence_split, type(part).__name__
    if split is None:
        return [f"{name} cannot split a sequence over processes (no finite reach, no independent channels, no heads to split)"]
    if split == "segments":  # a segment-recurrent block gathers the context it reads itself (``ContextRun.span``)
        return []
    if split == "body":
        return [problem for inner in part.stream_parts() for problem in split_problems(inner, processes)]
    if split == "channels" and part.dim < processes:
        return [f"{name} has {part.dim} channels, fewer than the {processes} processes that would share them"]
    return []


def context_parallel_problems(model: SequenceModel, processes: int) -> list[str]:
    """Why ``model`` cannot run with its sequences split over ``processes`` processes (empty: it can)."""
    problems = [problem for block in model.blocks for problem in split_problems(block, processes)]
    return [f"model {model.config.name!r}: {problem}" for problem in dict.fromkeys(problems)]


def context_parallel_logits(
    model: SequenceModel,
    tokens: torch.Tensor,
    mask: torch.Tensor | None,
    shard: ContextShard,
    state=None,
    return_state: bool = False,
    tokens_given_whole: bool = True,
):
    """Logits (batch, stop - start, vocab) at this process's shard of ``tokens`` (batch, length), the
    whole batch (every process of ``shard.group`` passes the same tokens and mask), or with
    ``tokens_given_whole=False`` the shard's tokens alone (batch, stop - start) and the whole batch's mask;
    a classifier's (batch, num_classes), the same on every process (tokens (batch, 2, length) for the dual
    encoder). A segment-recurrent model (Transformer-XL) continues its stream ``state`` by the segment
    ``tokens`` (``return_state``: and returns the next state, the same on every process)."""
    if not isinstance(tokens, torch.Tensor) or tokens.dim() < 2:
        raise ValueError(f"tokens must be a (batch, length) tensor, got {getattr(tokens, 'shape', type(tokens).__name__)}")
    if shard.length < shard.size:
        raise ValueError(f"sequences of {shard.length} tokens cannot be split over {shard.size} processes: give each at least one token")
    expected = shard.length if tokens_given_whole else shard.stop - shard.start
    if tokens.shape[-1] != expected:
        what = f"sequences of {shard.length}" if tokens_given_whole else f"process {shard.rank}'s {expected} of sequences of {shard.length}"
        raise ValueError(f"tokens have length {tokens.shape[-1]}, but the shard was made for {what}")
    check_mask(mask, (*tokens.shape[:-1], shard.length))
    return model(tokens, mask, state=state, return_state=return_state, run=ContextRun(shard, mask, tokens_given_whole))


class ContextParallel(nn.Module):
    """``model`` run on this process's shard of every sequence: ``forward(tokens, mask)`` gives the logits
    of tokens [start, stop) of ``shard(length)`` (the module DDP or FSDP wraps). With ``gather``, every
    process receives the logits of every position (what evaluation reads, as from the model itself):
    the activations stay split, only the logits travel."""

    def __init__(self, model: SequenceModel, group, rank: int, size: int, gather: bool = False):
        super().__init__()
        problems = context_parallel_problems(model, size)
        if problems:
            raise ValueError("; ".join(problems))
        self.model, self.group, self.rank, self.size, self.gather = model, group, rank, size, gather

    @property
    def config(self):
        return self.model.config

    def shard(self, length: int) -> ContextShard:
        return ContextShard(self.group, self.rank, self.size, length)

    def forward(
        self, tokens: torch.Tensor, mask: torch.Tensor | None = None, *, length: int | None = None, state=None, return_state: bool = False
    ):
        """``length``: the sequences' length where ``tokens`` are this process's shard of them alone (a training step
        reads only those: ``Objective.batch(part=...)``); None where they are whole."""
        if self.gather and (state is not None or return_state or length is not None):
            raise ValueError("a split stream's logits stay with their shards: gather=True reads whole sequences (state=None, length=None)")
        shard = self.shard(tokens.shape[-1] if length is None else length)
        logits = context_parallel_logits(self.model, tokens, mask, shard, state, return_state, tokens_given_whole=length is None)
        if not self.gather or self.model.classifier is not None:  # class logits are whole on every process
            return logits
        shapes = [_resized(logits.shape, {1: stop - start}) for start, stop in shard.bounds]
        return torch.cat(exchange([logits] * shard.size, shapes, shard.group), dim=1)
