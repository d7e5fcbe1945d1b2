"""One differentiable all-to-all between the processes of a group, for pieces of any shapes, and a
tally of the bytes it sends (``tokenmix bench --kinds scale``)."""

from __future__ import annotations

import contextlib
import math

import torch
import torch.distributed as dist
from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor

_tallies: list[list[int]] = []  # open ``traffic()`` tallies


@contextlib.contextmanager
def traffic():
    """``with traffic() as sent:`` ``sent[0]`` counts the bytes this process's exchanges send to other
    processes in the block (forward; the backward sends as many back)."""
    sent = [0]
    _tallies.append(sent)
    try:
        yield sent
    finally:
        _tallies.remove(sent)


def exchange(pieces: list[torch.Tensor], shapes: list[tuple[int, ...]], group) -> list[torch.Tensor]:
    """Send ``pieces[j]`` to rank j of ``group``; return the piece each rank i sent here, shaped ``shapes[i]``.

    The pieces travel flattened in one all-to-all (sizes may differ, pieces may be empty; PyTorch's
    functional collective with autograd): its backward is the reverse exchange, so a gradient returns
    to the process that sent the piece."""
    send = torch.cat([piece.reshape(-1) for piece in pieces])
    sizes = [math.prod(shape) for shape in shapes]
    if _tallies:
        rank = dist.get_rank(group)
        outgoing = sum(piece.numel() for index, piece in enumerate(pieces) if index != rank) * send.element_size()
        for sent in _tallies:
            sent[0] += outgoing
    received = wait_tensor(all_to_all_single_autograd(send, sizes, [piece.numel() for piece in pieces], group))
    return [chunk.view(shape) for chunk, shape in zip(received.split(sizes), shapes, strict=True)]
