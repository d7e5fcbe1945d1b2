"""Sequence models: embedding -> blocks -> final norm -> task head (TNN, Qin et al. 2023, §3.4).

- task "lm": causal blocks, tied output embedding, logits (batch, length, vocab).
- task "mlm": bidirectional blocks, tied output embedding, logits (batch, length, vocab).
- task "classify": bidirectional blocks, pooling over real tokens (mean, or the first token),
  logits (batch, num_classes); with ``documents=2`` the Long Range Arena dual encoder (Tay et al.,
  "Long Range Arena: A Benchmark for Efficient Transformers", arXiv 2011.04006): tokens
  (batch, 2, length), both documents through the same blocks, an MLP on [u, v, u*v, u-v].
The embedding is scaled by sqrt(dim); there is no positional embedding (the mixers carry position).

Streaming (task "lm"): ``logits, state = model(tokens, state=state, return_state=True)`` continues
the stream in ``state`` (None: a new one, ``init_state``); any chunking gives the logits of one
forward over the whole stream. The state is a ``ModelState``: each block's own state (a block
carries its parts'), so a prompt is read once and every new token costs one step.
Recurrent models (Transformer-XL and FNetAR-XL) read a stream segment by segment: with the option
``segment_length=S`` (a run records its ``--seq-len``) each block keeps the block inputs of
earlier segments as memory (no gradient), the way they are trained.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.utils.checkpoint
from torch import nn

from ..mixers.base import check_mask, check_static_decoding, common_front_padding_period, common_padding_sides
from ..precision import autocast, check_precision
from ..state import StreamState, check_state
from ..validation import check_int
from .config import ModelConfig
from .registry import model_spec
from .saving import save_pretrained


def check_tokens(tokens: torch.Tensor, vocab_size: int, mask: torch.Tensor | None) -> None:
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
        shape = tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
        raise ValueError(f"tokens must be a (batch, length) tensor, got {shape}")
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool or tokens.is_complex():
        raise ValueError(f"tokens must be an integer tensor, got dtype {tokens.dtype}")
    if tokens.shape[1] < 1:
        raise ValueError("tokens must have length >= 1")
    low, high = (int(tokens.min()), int(tokens.max())) if tokens.numel() else (0, 0)
    if low < 0 or high >= vocab_size:  # as Python ints: a uint8 tensor would compare 256 as 0
        raise ValueError(f"tokens must lie in [0, vocab_size={vocab_size}), got range [{low}, {high}]")
    check_mask(mask, tuple(tokens.shape))


class PartRun(Protocol):
    """How the blocks run on a part of the sequence (``tokenmix.parallel.ContextRun``): ``local`` takes
    the part of a (batch, length) tensor, ``tokens_of`` the part's tokens (of whole sequences, or given as
    the part alone), ``run(part, h)`` runs a part that mixes tokens, ``pool``
    gives ``pool_hidden`` of the whole sequence from the part's hidden states; a segment-recurrent
    block reads its ``shard``, the padding ``mask_of`` positions, and gathers the ``span`` of positions
    its context needs."""

    shard: object  # a ``tokenmix.parallel.ContextShard``: start, stop, length

    def local(self, t: torch.Tensor | None) -> torch.Tensor | None: ...

    def tokens_of(self, tokens: torch.Tensor) -> torch.Tensor: ...

    def mask_of(self, begin: int, end: int) -> torch.Tensor | None: ...

    def span(self, x: torch.Tensor, span_of, axis: int = 1) -> tuple[torch.Tensor, tuple[int, int]]: ...

    def pool(self, h: torch.Tensor, how: str) -> torch.Tensor: ...

    def __call__(self, part: nn.Module, h): ...


@dataclass
class ModelState(StreamState):
    """A model's stream: every block's state, the position, and which model it belongs to."""

    blocks: list
    position: int
    model: str


def pooling_weights(mask: torch.Tensor | None, shape: tuple[int, int], how: str, dtype: torch.dtype, device=None) -> torch.Tensor:
    """(batch, length) weights whose sum of hidden states pools them (``pool_hidden``): 1 / count on the
    real tokens (mean), or 1 on the first or last real token."""
    real = torch.ones(shape, dtype=torch.bool, device=device) if mask is None else mask
    if how == "mean":
        weights = real.to(dtype)
        return weights / weights.sum(dim=1, keepdim=True).clamp_min(1.0)
    index = real.int().argmax(dim=1) if how == "first" else shape[1] - 1 - real.flip(1).int().argmax(dim=1)
    return torch.nn.functional.one_hot(index, shape[1]).to(dtype)


def pool_hidden(h: torch.Tensor, mask: torch.Tensor | None, how: str) -> torch.Tensor:
    """(batch, dim) summary of hidden states (batch, length, dim) over real tokens: their mean, or the
    first or last one."""
    return torch.einsum("bn,bnd->bd", pooling_weights(mask, h.shape[:2], how, h.dtype, h.device), h)


def _classifier(config: ModelConfig) -> nn.Module:
    """A linear layer on the pooled summary; the dual encoder's MLP on [u, v, u*v, u-v]."""
    if config.documents == 1:
        return nn.Linear(config.dim, config.num_classes)
    return nn.Sequential(nn.Linear(4 * config.dim, config.dim), nn.ReLU(), nn.Linear(config.dim, config.num_classes))


class SequenceModel(nn.Module):
    """A stack of blocks chosen by model name, with the head of ``config.task``."""

    no_weight_decay = ("embedding.weight",)  # tied with the output layer
    activation_checkpointing = False  # training sets it: blocks recompute their activations in the backward pass
    _precision = "fp32"

    @property
    def precision(self) -> str:
        """ "fp32", "bf16" or "fp16": the forward runs under autocast to that compute dtype (``tokenmix.precision``);
        the parameters keep theirs, and logits and class scores come out in float32. Set it to run a model in
        mixed precision: ``model.precision = "bf16"``."""
        return self._precision

    @precision.setter
    def precision(self, value: str) -> None:
        self._precision = check_precision(value)

    def __init__(self, config: ModelConfig):
        super().__init__()
        spec = model_spec(config.name)
        self.config = config
        dropout = config.options.dropout  # config.options: the resolved tree of every block and mixer option
        self.embedding = nn.Embedding(config.vocab_size, config.dim)
        nn.init.normal_(self.embedding.weight, std=config.dim**-0.5)
        self.embedding_dropout = nn.Dropout(dropout)
        if config.task not in spec.tasks:
            raise ValueError(f"task for model {config.name!r} must be one of {list(spec.tasks)}, got {config.task!r}")
        self.blocks = nn.ModuleList(spec.layers(config.dim, config.causal, config.depth, config.options))
        self.recurrent = any(getattr(block, "recurrent", False) for block in self.blocks)
        self.final_norm = nn.LayerNorm(config.dim)
        self.classifier = _classifier(config) if config.task == "classify" else None

    @property
    def padding_invariant_sides(self) -> tuple[str, ...]:
        """Sides on which padding leaves a row's real outputs (and pooled summary) those of the row alone: every block's."""
        return common_padding_sides(self.blocks)

    @property
    def front_padding_period(self) -> int | None:
        """Streaming: padding the front of a stream by a multiple of this many masked tokens leaves its
        real tokens' logits those of the stream alone (every block's, ``Mixer.front_padding_period``);
        None when no padding does."""
        return common_front_padding_period(self.blocks)

    @functools.cached_property
    def signature(self) -> str:
        """What a state must have been made for: this model's name, sizes and options."""
        return self.config.to_json()

    def init_state(
        self, batch_size: int, *, max_length: int | None = None, device=None, dtype: torch.dtype | None = None, masked: int = 0
    ) -> ModelState:
        """The state before the first token (task "lm"), on the parameters' device and dtype unless given.

        ``max_length``: the longest stream expected (mixers whose operator depends on the length use
        it, see ``Mixer.init_state``). ``masked``: the stream starts with this many masked (padding)
        positions, not read: the state that reading them would leave, at position ``masked`` (a server
        lands a short prompt on a batch further on this way, ``front_padding_period``).
        """
        if self.config.task != "lm":
            raise ValueError(f"only causal language models stream; this model has task={self.config.task!r}")
        check_int(batch_size, "batch_size", minimum=0)
        weight = self.embedding.weight
        device, dtype = torch.device(device) if device is not None else weight.device, dtype or weight.dtype
        check_int(masked, "masked", minimum=0)
        blocks = [block.init_state(batch_size, max_length=max_length, device=device, dtype=dtype, masked=masked) for block in self.blocks]
        return ModelState(blocks, masked, self.signature)

    def hidden_states(
        self, tokens: torch.Tensor, mask: torch.Tensor | None = None, state: ModelState | None = None, run: PartRun | None = None
    ):
        """Final-norm hidden states (batch, n, dim); with a state, the stream continued and the next state.

        ``run``: the blocks run on ``run.local``'s part of the sequence only, each calling ``run`` where a
        part mixes tokens (``tokenmix.parallel.ContextRun``: this process's shard, the rest exchanged;
        ``tokens`` may be that part alone, the padding ``mask`` is of whole sequences and checked by the run);
        with a state too (segment-recurrent models only), the blocks' ``step`` continues the stream by
        this part of a whole segment.
        """
        check_tokens(tokens, self.config.vocab_size, mask if run is None else None)
        local = (lambda t: t) if run is None else run.local
        parts = () if run is None else (run,)
        x = self.embed(tokens if run is None else run.tokens_of(tokens))
        if state is None:
            for block in self.blocks:
                x = self._run_block(block, x, local(mask), *parts)
            return self.final_norm(x), None
        if run is not None and not self.recurrent:
            raise ValueError("a stream (state) of this model runs in one process: only segment-recurrent models split a stream")
        self._check_state(state)  # the blocks' parts check batch and dtype
        blocks = []
        for block, block_state in zip(self.blocks, state.blocks, strict=True):
            x, block_state = self._run_block(block.step, x, block_state, local(mask), *parts)
            blocks.append(block_state)
        return self.final_norm(x), ModelState(blocks, state.position + tokens.shape[1], state.model)

    def _check_state(self, state) -> None:
        """ValueError unless ``state`` is a ``ModelState`` this model made."""
        check_state(state, ModelState, None, None, f"model {self.config.name!r}")
        if state.model != self.signature:
            raise ValueError(f"state was made by another model; expected one from this {self.config.name!r} model's init_state")

    @property
    def static_decoding(self) -> bool:
        """A language model whose every block decodes from static buffers (``Mixer.static_decoding``): generation
        can replay its one-token step as a CUDA graph (``tokenmix.generation.graphs``)."""
        return self.config.task == "lm" and all(block.static_decoding for block in self.blocks)

    def static_state(self, state: ModelState, capacity: int) -> ModelState:
        """A stream's ``state`` (after its prompt) in buffers that carry it on to ``capacity`` tokens in all, for
        ``static_step``. Its buffers count the positions, on the device; its ``position`` is 0 (so streams at any
        positions can share a batch of static buffers)."""
        check_static_decoding(self)
        self._check_state(state)
        check_int(capacity, "capacity", minimum=state.position + 1)
        blocks = [block.static_state(part, capacity) for block, part in zip(self.blocks, state.blocks, strict=True)]
        return ModelState(blocks, 0, state.model)

    def static_step(self, tokens: torch.Tensor, state: ModelState) -> torch.Tensor:
        """Logits (batch, vocab) of each row's next token after ``tokens`` (batch, 1), ``state`` (``static_state``'s)
        updated in place: the same kernels at every position and nothing read back from the device (the ids are not
        checked against the vocabulary here), so a CUDA graph replays it. A row must not pass the capacity."""
        if tokens.dim() != 2 or tokens.shape[1] != 1:
            raise ValueError(f"tokens must be (batch, 1) token ids, one per row, got shape {tuple(tokens.shape)}")
        with autocast(self.precision, tokens.device, cache=False):  # a graph must not read casts cached outside it
            x = self.embed(tokens)
            for block, block_state in zip(self.blocks, state.blocks, strict=True):
                x = block.static_step(x, block_state)
            return self._full_precision(self.token_logits(self.final_norm(x)))[:, -1]

    def _run_block(self, forward, *inputs):
        """A block's ``forward`` (its ``__call__`` or ``step``, where FSDP gathers its weights) on ``inputs``;
        with ``activation_checkpointing`` its activations are recomputed in the backward pass, not kept."""
        if self.activation_checkpointing and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(forward, *inputs, use_reentrant=False)
        return forward(*inputs)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """The blocks' input: token embeddings scaled by sqrt(dim), (batch, n, dim)."""
        return self.embedding_dropout(self.embedding(tokens) * math.sqrt(self.config.dim))

    def token_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Logits of final-norm hidden states by the tied output embedding, (batch, n, vocab)."""
        return h @ self.embedding.weight.t()

    def forward(
        self,
        tokens: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        state: ModelState | None = None,
        return_state: bool = False,
        run: PartRun | None = None,
    ):
        """Logits; with ``state`` or ``return_state=True``, the stream's next logits and the state after them;
        with ``run``, the logits of its part of the sequence (``hidden_states``)."""
        if self.classifier is not None:
            if state is not None or return_state:
                raise ValueError("only causal language models stream; a classifier reads whole examples (state=None)")
            return self.classify(tokens, mask, run)
        if state is None and return_state:
            check_tokens(tokens, self.config.vocab_size, mask)
            state = self.init_state(tokens.shape[0], device=tokens.device)
        with autocast(self.precision, tokens.device):
            h, next_state = self.hidden_states(tokens, mask, state, run)
            logits = self._full_precision(self.token_logits(h))
        return (logits, next_state) if return_state else logits

    def _full_precision(self, scores: torch.Tensor) -> torch.Tensor:
        """Logits or class scores in float32 when computed in mixed precision (the loss and sampling read them)."""
        return scores if self.precision == "fp32" else scores.float()

    def classify(self, tokens: torch.Tensor, mask: torch.Tensor | None = None, run: PartRun | None = None) -> torch.Tensor:
        """Class logits (batch, num_classes) of tokens (batch, length), or (batch, 2, length) for the dual
        encoder; with ``run``, pooled over the parts of the sequence (``run.pool``)."""
        documents = self.config.documents
        if documents > 1:
            if not isinstance(tokens, torch.Tensor) or tokens.dim() != 3 or tokens.shape[1] != documents:
                shape = tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
                raise ValueError(f"tokens must be (batch, {documents}, length) for a model of documents={documents}, got {shape}")
            if run is None:
                check_mask(mask, tuple(tokens.shape))
            tokens, mask = tokens.flatten(0, 1), None if mask is None else mask.flatten(0, 1)
        with autocast(self.precision, tokens.device):
            h, _ = self.hidden_states(tokens, mask, run=run)
            pooled = pool_hidden(h, mask, self.config.pool) if run is None else run.pool(h, self.config.pool)
            if documents > 1:
                u, v = pooled.view(-1, documents, pooled.shape[-1]).unbind(1)
                pooled = torch.cat([u, v, u * v, u - v], dim=-1)
            return self._full_precision(self.classifier(pooled))

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def with_options(self, **changes) -> SequenceModel:
        """A copy with these weights under the options changed (an XL model's ``segment_length``), on the
        same device and dtype and in the same precision, in eval mode."""
        saved = self.config.to_dict()
        config = ModelConfig.from_dict({**saved, "options": {**saved["options"], **changes}})
        parameter = next(self.parameters())
        copy = SequenceModel(config).to(parameter.device, parameter.dtype).eval()
        copy.load_state_dict(self.state_dict())
        copy.precision = self.precision
        return copy

    def save_pretrained(self, directory) -> None:
        """``config.json`` and ``model.safetensors`` in ``directory`` (``models.saving``)."""
        save_pretrained(self, directory)


def build_model(
    name: str,
    *,
    task: str = "lm",
    vocab_size: int,
    dim: int = 256,
    depth: int = 4,
    num_classes: int | None = None,
    pool: str = "mean",
    documents: int = 1,
    options: dict | None = None,
    **more_options,
) -> SequenceModel:
    """Build a model by name (see ``list_models()``); options reach the blocks and mixers.

    Options are keyword arguments, or the ``options`` dict for names this function takes itself
    (a TCN inside the TNN block: ``build_model("tnn", mixer="tcn", options={"depth": 2}, ...)``).
    """
    config = ModelConfig(name, task, vocab_size, dim, depth, num_classes, {**(options or {}), **more_options}, pool, documents)
    return SequenceModel(config)
