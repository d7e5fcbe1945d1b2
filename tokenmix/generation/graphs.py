"""Decoding from static buffers, replayed as a CUDA graph (as vLLM replays its decode batches).

A model whose every part decodes from static buffers (``SequenceModel.static_decoding``) steps one
token per row from buffers made once for the whole stream (``static_state``, ``static_step``): the
same kernels at every position, nothing read back from the device. On CUDA, ``StepGraph`` captures
that step once as a CUDA graph, the token ids in a static input buffer and the logits in a static
output, and replays it for every token: one launch where eager decoding at a small batch spends its
time launching dozens of small kernels. ``generate`` captures one graph for its batch; the server one
per batch of rows (a cohort), its buffers made for a ``graph_batch`` of rows (a row joining a spare row or a
hole is written in place), captured again when the batch outgrows them or drops its holes. On the CPU the
same step runs eagerly: the path the tests hold to ``step``.
"""

from __future__ import annotations

import torch

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
            f"model {model.config.name!r} does not decode from static buffers (a part of it steps a stream only, "
            "Mixer.static_decoding): use decoding='stream' or 'auto'"
        )
    return decoding == "static" or (decoding == "auto" and device.type == "cuda" and model.static_decoding)


def graph_batch(rows: int) -> int:
    """The rows a server makes a batch's static buffers for, to hold ``rows``: 1, 2, 4, then a multiple of 8 (vLLM's
    capture sizes). Rows that join later take the spare ones in place, so the graph captured on the buffers stays
    until the batch outgrows them."""
    return rows if rows <= 2 else 4 if rows <= 4 else -(-rows // 8) * 8


class StepGraph:
    """``model.static_step`` on the buffers of the static ``state`` captured as one CUDA graph: ``step(tokens)`` writes
    the ids into the graph's input buffer and replays it. The graph keeps the state's tensors (it reads and writes
    them); the parts' operators it reads (a Toeplitz mixer's static taps) must stay: the weights must not change.

    ``pool`` (``torch.cuda.graph_pool_handle()``) shares one memory pool between graphs, as vLLM's decode graphs do:
    their temporaries take the memory of the largest step, not the sum of all. A later capture may place its logits
    where an earlier graph keeps temporaries, which a replay of that graph overwrites: ``step`` returns a copy of the
    logits at once, and the state's buffers (made before the capture) and the caches (filled by the eager step before
    it) hold no memory of the pool."""

    @torch.no_grad()
    def __init__(self, model, state, pool=None):
        device = next(model.parameters()).device
        if device.type != "cuda":
            raise ValueError(f"CUDA graphs need a model on a CUDA device, got {device}")
        self.buffers = state.tensors()
        self.tokens = torch.zeros(state.batch_size, 1, dtype=torch.long, device=device)
        side = torch.cuda.Stream()  # one eager step first, of one row's copy: it fills the caches the graph then reads
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            model.static_step(self.tokens[:1], state.select([0]))
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.logits = model.static_step(self.tokens, state)

    def captured_on(self, state) -> bool:
        """Whether ``state`` holds the very tensors the graph was captured on (a ``select`` or ``concat`` makes new
        ones; ``assign`` writes rows in place)."""
        tensors = state.tensors()
        return len(tensors) == len(self.buffers) and all(mine is theirs for mine, theirs in zip(tensors, self.buffers, strict=True))

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits (batch, vocab) after ``tokens`` (batch,), a copy of the graph's output buffer."""
        self.tokens[:, 0].copy_(tokens)
        self.graph.replay()
        return self.logits.clone()


class StaticDecoder:
    """Steps the ``state`` of ``model``'s streams (every row read to the same position) on, one token per row per
    ``step``, up to ``capacity`` tokens in all, from static buffers; with ``graph`` (CUDA only; default: on a model on
    CUDA) as a ``StepGraph``."""

    @torch.no_grad()
    def __init__(self, model, state, capacity: int, graph: bool | None = None):
        self.model, self.rows, self.left = model, state.batch_size, capacity - state.position
        graph = next(model.parameters()).device.type == "cuda" if graph is None else graph
        self.state = model.static_state(state, capacity)
        self.graph = StepGraph(model, self.state) if graph else None

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits (rows, vocab) of the token after ``tokens`` (rows,) in every stream."""
        if self.left < 1:
            raise ValueError("the streams have reached the capacity their static buffers were made for")
        self.left -= 1
        if self.graph is None:
            return self.model.static_step(tokens[:, None], self.state)
        return self.graph.step(tokens)
