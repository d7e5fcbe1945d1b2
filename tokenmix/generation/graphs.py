"""Decoding from static buffers, replayed as a CUDA graph (as vLLM replays its decode batches).

A model whose every part decodes from static buffers (``SequenceModel.static_decoding``) steps one
token per row from buffers made once for the whole stream (``static_state``, ``static_step``): the
same kernels at every position, nothing read back from the device. On CUDA, ``StaticDecoder``
captures that step once as a CUDA graph, the token ids in a static input buffer and the logits in a
static output, and replays it for every token: one launch where eager decoding at a small batch
spends its time launching dozens of small kernels. The batch is padded to a bucket (1, 2, 4, 8, ...
rows), so a server can keep a graph per bucket. On the CPU, or with ``graph=False``, the same step
runs eagerly: the path the tests hold to ``step``.
"""

from __future__ import annotations

import torch

from ..validation import check_int

DECODINGS = ("auto", "static", "stream")


def check_decoding(decoding: str) -> str:
    if decoding not in DECODINGS:
        raise ValueError(f"decoding must be one of {list(DECODINGS)}, got {decoding!r}")
    return decoding


def use_static_decoding(model, decoding: str, device: torch.device) -> bool:
    """Whether ``decoding`` ("auto": static buffers replayed as a CUDA graph on CUDA where the model has them, else its
    stream's ``step``; "static"; "stream") decodes ``model`` from static buffers; ValueError for a "static" it lacks."""
    if check_decoding(decoding) == "static" and not model.static_decoding:
        raise ValueError(
            f"model {model.config.name!r} does not decode from static buffers (a part of it, such as a Transformer-XL memory, "
            "moves at segment boundaries): use decoding='stream' or 'auto'"
        )
    return decoding == "static" or (decoding == "auto" and device.type == "cuda" and model.static_decoding)


def batch_bucket(rows: int) -> int:
    """The batch size a graph is captured for: the power of two at or above ``rows``."""
    check_int(rows, "rows")
    return 1 << (rows - 1).bit_length()


class StepGraph:
    """``model.static_step`` on the buffers of the static ``state`` captured as one CUDA graph: ``step(tokens)`` writes
    the ids into the graph's input buffer and replays it. The parts' operators the step reads (a Toeplitz mixer's
    cached taps) must stay as they are while the graph lives: the weights must not change."""

    def __init__(self, model, state):
        device = next(model.parameters()).device
        if device.type != "cuda":
            raise ValueError(f"CUDA graphs need a model on a CUDA device, got {device}")
        self.buffers = [tensor.data_ptr() for tensor in state.tensors()]
        self.tokens = torch.zeros(state.batch_size, 1, dtype=torch.long, device=device)
        side = torch.cuda.Stream()  # one eager step first, on a copy: it fills the caches the graph then reads
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            model.static_step(self.tokens, state.to())
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = model.static_step(self.tokens, state)

    def captured_on(self, state) -> bool:
        """Whether ``state`` holds the buffers the graph was captured on (a ``select`` or ``concat`` makes new ones;
        ``assign`` writes rows in place)."""
        return [tensor.data_ptr() for tensor in state.tensors()] == self.buffers

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits (batch, vocab) after ``tokens`` (batch,): the graph's output buffer, overwritten by the next replay."""
        self.tokens[:, 0].copy_(tokens)
        self.graph.replay()
        return self.logits


class StaticDecoder:
    """Steps the ``state`` of ``model``'s streams (every row read to the same position) on, one token per row per
    ``step``, up to ``capacity`` tokens in all, from static buffers; with ``graph`` (CUDA only; default: on a model on
    CUDA), as a ``StepGraph`` of a bucket's rows (the extra rows repeat the first stream; their logits are not returned)."""

    def __init__(self, model, state, capacity: int, graph: bool | None = None):
        self.model, self.rows = model, state.batch_size
        graph = next(model.parameters()).device.type == "cuda" if graph is None else graph
        bucket = batch_bucket(self.rows) if graph else self.rows
        padded = state if bucket == self.rows else state.select(list(range(self.rows)) + [0] * (bucket - self.rows))
        self.state = model.static_state(padded, capacity)
        self.graph = StepGraph(model, self.state) if graph else None
        self.tokens = torch.zeros(bucket, dtype=torch.long, device=next(model.parameters()).device)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits (rows, vocab) of the token after ``tokens`` (rows,) in every stream."""
        self.tokens[: self.rows] = tokens
        if self.graph is None:
            return self.model.static_step(self.tokens[:, None], self.state)[: self.rows]
        return self.graph.step(self.tokens)[: self.rows]
