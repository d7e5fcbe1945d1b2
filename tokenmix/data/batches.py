"""Batches for the LM and masked-LM objectives."""

from __future__ import annotations

import torch


def step_seed(seed: int, step: int, rank: int = 0) -> int:
    """A seed determined by (seed, step, rank): a resumed run draws what an uninterrupted one would."""
    return (seed * 1_000_003 + step) * 97 + rank


def step_generator(seed: int, step: int, rank: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(step_seed(seed, step, rank))


Part = tuple[int, int] | None  # positions [start, stop) of each window a process reads (context parallelism); None: all


def random_windows(data: torch.Tensor, batch_size: int, length: int, generator: torch.Generator, part: Part = None) -> torch.Tensor:
    """``batch_size`` random windows of ``length + 1`` tokens, (batch, length + 1) int64. ``data``: a 1-D tensor
    or a prepared split (``prepared.TokenFiles``), which reads only these windows. ``part`` (start, stop): of each
    window only positions [start, stop] (a shard's inputs and its next tokens; the draws are the same)."""
    if data.numel() < length + 1:
        raise ValueError(f"seq_len={length} needs at least {length + 1} tokens; the split has {data.numel()}")
    starts = torch.randint(0, data.numel() - length, (batch_size,), generator=generator)
    first, last = (0, length) if part is None else part
    return torch.stack([data[start + first : start + last + 1] for start in starts.tolist()]).long()


def document_windows(
    data, batch_size: int, size: int, generator: torch.Generator, pad_id: int, part: Part = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch_size`` windows of ``size`` ids, each inside one document of a prepared split (``data.document_at``):
    a random id picks the document (documents drawn in proportion to their length), a second draw the window's
    start in it; a document of fewer ids is the whole of it, padded with ``pad_id``. (windows, real): int64 ids and
    where they are the document's, (batch, size); with ``part`` (start, stop) the windows' positions [start, stop)
    alone (only those are read), ``real`` still of whole windows (the documents' lengths, from the index)."""
    first, last = (0, size) if part is None else part
    windows = torch.full((batch_size, last - first), pad_id, dtype=torch.long)
    real = torch.zeros(batch_size, size, dtype=torch.bool)
    for row, position in enumerate(torch.randint(0, data.numel(), (batch_size,), generator=generator).tolist()):
        start, end = data.document_at(position)
        if end - start > size:
            start += int(torch.randint(0, end - start - size + 1, (1,), generator=generator))
        count = min(end - start, size)
        ids = data[start + first : start + max(first, min(count, last))]
        windows[row, : len(ids)], real[row, :count] = ids, True
    return windows, real


def lm_batch(data: torch.Tensor, batch_size: int, length: int, generator: torch.Generator, part: Part = None):
    """(inputs, targets): next-token prediction on random windows (``part``: their positions [start, stop) alone)."""
    window = random_windows(data, batch_size, length, generator, part)
    return window[:, :-1], window[:, 1:]


def document_lm_batch(data, batch_size: int, length: int, generator: torch.Generator, pad_id: int, part: Part = None):
    """(inputs, targets, mask) of windows within documents: padding is masked and never a target (-100);
    mask None when no window is padded. ``part``: inputs and targets of positions [start, stop) alone, the mask
    of whole windows."""
    first, last = (0, length) if part is None else part
    window, real = document_windows(data, batch_size, length + 1, generator, pad_id, (first, last + 1))
    targets = window[:, 1:].masked_fill(~real[:, first + 1 : last + 1], -100)
    return window[:, :-1], targets, None if bool(real.all()) else real[:, :-1]


def mask_tokens(
    tokens: torch.Tensor, mask_id: int, vocab_size: int, generator: torch.Generator, rate: float = 0.15, part: Part = None, length: int = 0
):
    """BERT masking: pick ``rate`` of the tokens; of those 80 % -> mask_id, 10 % -> random, 10 % kept.
    With ``part`` (start, stop), ``tokens`` are those positions of windows of ``length``, masked as they are in the
    whole windows (the same draws).

    Returns (inputs, targets) with targets -100 where nothing is predicted.
    """
    shape, columns = (tokens.shape, slice(None)) if part is None else ((tokens.shape[0], length), slice(*part))
    selected = torch.rand(shape, generator=generator)[:, columns] < rate
    action = torch.rand(shape, generator=generator)[:, columns]
    random_tokens = torch.randint(0, vocab_size, shape, generator=generator)[:, columns]
    inputs = tokens.clone()
    inputs[selected & (action < 0.8)] = mask_id
    replace = selected & (action >= 0.8) & (action < 0.9)
    inputs[replace] = random_tokens[replace]
    targets = torch.where(selected, tokens, torch.full_like(tokens, -100))
    return inputs, targets


def mlm_batch(
    data: torch.Tensor, batch_size: int, length: int, generator: torch.Generator, mask_id: int, vocab_size: int, part: Part = None
):
    """(inputs, targets) of masked-LM windows; random replacements drawn from ``[0, vocab_size)`` (``part``: of
    positions [start, stop) alone)."""
    window = random_windows(data, batch_size, length - 1, generator, None if part is None else (part[0], part[1] - 1))
    return mask_tokens(window, mask_id, vocab_size, generator, part=part, length=length)


def document_mlm_batch(
    data, batch_size: int, length: int, generator: torch.Generator, mask_id: int, vocab_size: int, pad_id: int, part: Part = None
):
    """(inputs, targets, mask) of masked-LM windows within documents: padding masked, never a target (``part``:
    inputs and targets of positions [start, stop) alone, the mask of whole windows)."""
    window, real = document_windows(data, batch_size, length, generator, pad_id, part)
    inputs, targets = mask_tokens(window, mask_id, vocab_size, generator, part=part, length=length)
    shown = real if part is None else real[:, part[0] : part[1]]
    inputs = torch.where(shown, inputs, window)  # padding stays padding
    return inputs, targets.masked_fill(~shown, -100), None if bool(real.all()) else real


def contiguous_windows(data: torch.Tensor, length: int):
    """Non-overlapping windows covering ``data`` so that every token after the first is a target once.

    Yields (inputs, targets, mask) rows: inputs = data[s : s + length], targets shifted by one;
    the last window is right-padded with mask False.
    """
    total = data.numel() - 1
    for start in range(0, total, length):
        size = min(length, total - start)
        inputs = torch.zeros(length, dtype=torch.long)
        targets = torch.zeros(length, dtype=torch.long)
        inputs[:size] = data[start : start + size]
        targets[:size] = data[start + 1 : start + size + 1]
        mask = torch.arange(length) < size
        yield inputs, targets, mask


class StreamBatches:
    """Contiguous streams for segment-recurrent training (Transformer-XL style).

    The split is cut into ``rows * world_size`` equal streams; this rank reads ``rows`` of them.
    Step s reads segment s mod ``segments`` of each stream, so consecutive steps continue the same
    text and a model's memory stays meaningful; a new pass over the data starts fresh. ``data``: a 1-D
    tensor or a prepared split, read segment by segment.
    """

    def __init__(self, data, rows: int, length: int, rank: int = 0, world_size: int = 1):
        total_rows = rows * world_size
        stream_length = data.numel() // total_rows
        self.segments = (stream_length - 1) // length
        if self.segments < 1:
            raise ValueError(f"the split ({data.numel()} tokens) is too short for {total_rows} streams of {length + 1} tokens")
        self.data, self.length = data, length
        self.starts = [stream * stream_length for stream in range(rank * rows, (rank + 1) * rows)]

    def batch(self, step: int, part: Part = None):
        """(inputs, targets, fresh): fresh is True where a pass over the streams begins (``part``: of the segments'
        positions [start, stop) alone)."""
        segment = step % self.segments
        first, last = (0, self.length) if part is None else part
        offset = segment * self.length
        window = torch.stack([self.data[start + offset + first : start + offset + last + 1] for start in self.starts]).long()
        return window[:, :-1], window[:, 1:], segment == 0
