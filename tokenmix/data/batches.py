"""Batches for the LM and masked-LM objectives."""

from __future__ import annotations

import torch


def step_seed(seed: int, step: int, rank: int = 0) -> int:
    """A seed determined by (seed, step, rank): a resumed run draws what an uninterrupted one would."""
    return (seed * 1_000_003 + step) * 97 + rank


def step_generator(seed: int, step: int, rank: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(step_seed(seed, step, rank))


def random_windows(data: torch.Tensor, batch_size: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """``batch_size`` random windows of ``length + 1`` tokens, (batch, length + 1) int64. ``data``: a 1-D tensor
    or a prepared split (``prepared.TokenFiles``), which reads only these windows."""
    if data.numel() < length + 1:
        raise ValueError(f"seq_len={length} needs at least {length + 1} tokens; the split has {data.numel()}")
    starts = torch.randint(0, data.numel() - length, (batch_size,), generator=generator)
    return torch.stack([data[start : start + length + 1] for start in starts.tolist()]).long()


def document_windows(data, batch_size: int, size: int, generator: torch.Generator, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch_size`` windows of ``size`` ids, each inside one document of a prepared split (``data.document_at``):
    a random id picks the document (documents drawn in proportion to their length), a second draw the window's
    start in it; a document of fewer ids is the whole of it, padded with ``pad_id``. (windows, real): int64 ids and
    where they are the document's, both (batch, size)."""
    windows = torch.full((batch_size, size), pad_id, dtype=torch.long)
    real = torch.zeros(batch_size, size, dtype=torch.bool)
    for row, position in enumerate(torch.randint(0, data.numel(), (batch_size,), generator=generator).tolist()):
        start, end = data.document_at(position)
        if end - start > size:
            start += int(torch.randint(0, end - start - size + 1, (1,), generator=generator))
        ids = data[start : min(end, start + size)]
        windows[row, : len(ids)], real[row, : len(ids)] = ids, True
    return windows, real


def lm_batch(data: torch.Tensor, batch_size: int, length: int, generator: torch.Generator):
    """(inputs, targets): next-token prediction on random windows."""
    window = random_windows(data, batch_size, length, generator)
    return window[:, :-1], window[:, 1:]


def document_lm_batch(data, batch_size: int, length: int, generator: torch.Generator, pad_id: int):
    """(inputs, targets, mask) of windows within documents: padding is masked and never a target (-100);
    mask None when no window is padded."""
    window, real = document_windows(data, batch_size, length + 1, generator, pad_id)
    targets = window[:, 1:].masked_fill(~real[:, 1:], -100)
    return window[:, :-1], targets, None if bool(real.all()) else real[:, :-1]


def mask_tokens(tokens: torch.Tensor, mask_id: int, vocab_size: int, generator: torch.Generator, rate: float = 0.15):
    """BERT masking: pick ``rate`` of the tokens; of those 80 % -> mask_id, 10 % -> random, 10 % kept.

    Returns (inputs, targets) with targets -100 where nothing is predicted.
    """
    draw = torch.rand(tokens.shape, generator=generator)
    selected = draw < rate
    action = torch.rand(tokens.shape, generator=generator)
    random_tokens = torch.randint(0, vocab_size, tokens.shape, generator=generator)
    inputs = tokens.clone()
    inputs[selected & (action < 0.8)] = mask_id
    replace = selected & (action >= 0.8) & (action < 0.9)
    inputs[replace] = random_tokens[replace]
    targets = torch.where(selected, tokens, torch.full_like(tokens, -100))
    return inputs, targets


def mlm_batch(data: torch.Tensor, batch_size: int, length: int, generator: torch.Generator, mask_id: int, vocab_size: int):
    """(inputs, targets) of masked-LM windows; random replacements drawn from ``[0, vocab_size)``."""
    window = random_windows(data, batch_size, length - 1, generator)
    return mask_tokens(window, mask_id, vocab_size, generator)


def document_mlm_batch(data, batch_size: int, length: int, generator: torch.Generator, mask_id: int, vocab_size: int, pad_id: int):
    """(inputs, targets, mask) of masked-LM windows within documents: padding masked, never a target."""
    window, real = document_windows(data, batch_size, length, generator, pad_id)
    inputs, targets = mask_tokens(window, mask_id, vocab_size, generator)
    inputs = torch.where(real, inputs, window)  # padding stays padding
    return inputs, targets.masked_fill(~real, -100), None if bool(real.all()) else real


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

    def batch(self, step: int):
        """(inputs, targets, fresh): fresh is True where a pass over the streams begins."""
        segment = step % self.segments
        offset = segment * self.length
        window = torch.stack([self.data[start + offset : start + offset + self.length + 1] for start in self.starts]).long()
        return window[:, :-1], window[:, 1:], segment == 0
