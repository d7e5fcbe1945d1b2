"""One differentiable all-to-all between the processes of a group, for pieces of any shapes."""

from __future__ import annotations

import math

import torch
from torch.distributed.nn.functional import all_to_all_single


def exchange(pieces: list[torch.Tensor], shapes: list[tuple[int, ...]], group) -> list[torch.Tensor]:
    """Send ``pieces[j]`` to rank j of ``group``; return the piece each rank i sent here, shaped ``shapes[i]``.

    The pieces travel flattened in one ``all_to_all_single`` (sizes may differ, pieces may be empty);
    its backward is the reverse exchange, so a gradient returns to the process that sent the piece."""
    send = torch.cat([piece.reshape(-1) for piece in pieces])
    sizes = [math.prod(shape) for shape in shapes]
    received = all_to_all_single(send.new_empty(sum(sizes)), send, sizes, [piece.numel() for piece in pieces], group=group)
    return [chunk.view(shape) for chunk, shape in zip(received.split(sizes), shapes, strict=True)]
