"""Autoregressive generation from a causal LM, with the model's streaming state.

``generate`` reads the prompts once (a prefill of the length they share, in one call), then adds
one token per call: each row's remaining prompt tokens are fed as given, and once a row's prompt
is used up its next token is chosen from the logits (greedy at temperature 0, else sampled with
top-k / top-p). Rows that have all their tokens or hit their stop leave the batch
(``state.select``). Each row samples from its own generator, seeded from (seed, row), and draws
only for its own new tokens, so what a row samples does not depend on the other prompts, the
batch size, or streaming one prompt at a time. ``naive_generate`` re-runs the whole sequence for
every token: the reference the tests hold ``generate`` to.

After the prefill the tokens come from the model's stream ``step`` (rows that end leave the batch),
or from static buffers (``decoding``; on CUDA replayed as a CUDA graph, ``generation.graphs``; rows that
end stay in the batch, unread).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..data.tokenizer import Tokenizer
from ..io.progress import progress_bar
from ..validation import check_int
from .graphs import StaticDecoder, use_static_decoding
from .sampling import check_sampling, choose_tokens, row_generator
from .stops import Stop, StopRule


def _check_options(model, prompts, max_new_tokens, rows) -> tuple[list[torch.Tensor], list[int]]:
    if model.config.task != "lm":
        raise ValueError(f"generate needs a model with task='lm', got task={model.config.task!r}")
    if isinstance(prompts, torch.Tensor) or not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("prompts must be a non-empty list of 1-D token id tensors")
    for index, prompt in enumerate(prompts):
        if not isinstance(prompt, torch.Tensor) or prompt.dim() != 1 or prompt.numel() < 1 or prompt.is_floating_point():
            raise ValueError(f"prompts[{index}] must be a non-empty 1-D tensor of token ids")
    check_int(max_new_tokens, "max_new_tokens", minimum=0)
    rows = list(range(len(prompts))) if rows is None else list(rows)
    if len(rows) != len(prompts) or any(isinstance(row, bool) or not isinstance(row, int) or row < 0 for row in rows):
        raise ValueError(f"rows must be one non-negative row number per prompt ({len(prompts)}), got {rows!r}")
    return [prompt.long() for prompt in prompts], rows  # the tokenizer's uint8 ids included


class _StreamSteps:
    """The model's stream ``step`` (each row told the ``steps`` it has left); rows that end leave the batch."""

    def __init__(self, model, state, steps: list[int]):
        self.model, self.state = model, state.limit_steps(torch.tensor(steps))

    def keep(self, slots: list[int]) -> None:
        self.state = self.state.select(slots)

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        logits, self.state = self.model(tokens[:, None], state=self.state, return_state=True)
        return logits[:, -1]


class _StaticSteps:
    """A ``StaticDecoder``; rows that end stay in its batch, their logits unread."""

    def __init__(self, decoder: StaticDecoder):
        self.decoder, self.live = decoder, list(range(decoder.rows))

    def keep(self, slots: list[int]) -> None:
        self.live = [self.live[slot] for slot in slots]

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        every = torch.zeros(self.decoder.rows, dtype=torch.long, device=tokens.device)
        every[self.live] = tokens
        return self.decoder.step(every)[self.live]


@torch.no_grad()
def generate(
    model,
    prompts: list[torch.Tensor],
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    stop: Stop = None,
    seed: int | None = None,
    rows: Sequence[int] | None = None,
    on_token: Callable[[int, int], None] | None = None,
    tokenizer: Tokenizer | None = None,
    progress: bool = False,
    max_length: int | None = None,
    decoding: str = "auto",
) -> list[torch.Tensor]:
    """The new token ids of each prompt (1-D id tensors of any lengths), decoded with the model's state.

    ``stop``: a token id or a list of ids that ends a row (its ids end with them), or a string: the
    row ends with the token that completes it in the decoded text (``StopRule``; ``tokenizer``
    decodes, bytes by default). ``seed`` fixes the sampling: prompt i samples with the generator of
    (seed, rows[i]) (``rows`` default 0, 1, ...), so a prompt generated alone with ``rows=[i]`` gets
    what it gets as row i of a batch (XL models stream in segments of their ``segment_length``).
    ``on_token(row, id)`` is called for every new token as it is chosen (streaming output);
    ``progress`` shows a bar of the tokens made. ``max_length``: the longest stream the state is made
    for (default: the longest prompt plus ``max_new_tokens``); mixers whose operator depends on the
    length (``fd_tno``'s horizon, an automatic TCN dilation) use it, so a server that makes every
    state for its context length gives what ``generate`` gives with that ``max_length``.
    ``decoding``: "stream" (the model's ``step``), "static" (static buffers, ``generation.graphs``: on CUDA replayed
    as a CUDA graph, on the CPU run eagerly) or "auto" (static on CUDA where the model decodes from static
    buffers, else stream); the tokens are the same to rounding.
    """
    prompts, rows = _check_options(model, prompts, max_new_tokens, rows)
    check_sampling(temperature, top_k, top_p, seed)
    longest = max(prompt.numel() for prompt in prompts) + max_new_tokens
    if max_length is not None:
        check_int(max_length, "max_length", minimum=longest)
    stop = StopRule(stop, model.config.vocab_size, tokenizer)
    generators = [None if seed is None else row_generator(seed, row) for row in rows]
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    lengths = [prompt.numel() for prompt in prompts]
    new: list[list[int]] = [[] for _ in prompts]
    shared = min(lengths)
    static = use_static_decoding(model, decoding, device) and max_new_tokens > 0  # no step, no buffers
    state = model.init_state(len(prompts), max_length=max_length or longest, device=device)
    logits, state = model(torch.stack([prompt[:shared] for prompt in prompts]).to(device), state=state, return_state=True)
    logits, left = logits[:, -1], [length - shared + max_new_tokens - 1 for length in lengths]  # a row's last token is not read
    steps = _StaticSteps(StaticDecoder(model, state, max_length or longest)) if static else _StreamSteps(model, state, left)
    active, position = list(range(len(prompts))), shared  # prompts still in the batch; tokens read so far
    bar = progress_bar(total=len(prompts) * max_new_tokens, unit="token", desc="generating", disable=not progress)
    while active and max_new_tokens:
        sampling = [slot for slot, index in enumerate(active) if position >= lengths[index]]  # rows past their prompt
        picks = choose_tokens(logits[sampling], temperature, top_k, top_p, [generators[active[slot]] for slot in sampling])
        chosen = dict(zip(sampling, picks.tolist(), strict=True))
        inputs, kept = [], []
        for slot, index in enumerate(active):
            if slot in chosen:
                new[index].append(chosen[slot])
                inputs.append(chosen[slot])
                if on_token is not None:
                    on_token(index, chosen[slot])
            else:
                inputs.append(int(prompts[index][position]))  # still reading this row's prompt
            if len(new[index]) < max_new_tokens and not stop.reached(new[index]):
                kept.append(slot)
        bar.update(len(chosen))
        if len(kept) < len(active):
            active = [active[slot] for slot in kept]
            if not active:
                break
            steps.keep(kept)
            inputs = [inputs[slot] for slot in kept]
        logits = steps(torch.tensor(inputs, device=device))
        position += 1
    bar.close()
    model.train(was_training)
    return [torch.tensor(ids, dtype=torch.long) for ids in new]


@torch.no_grad()
def naive_generate(model, prompt: torch.Tensor, max_new_tokens: int, stop: Stop = None, tokenizer: Tokenizer | None = None) -> torch.Tensor:
    """Reference (tests only): greedy decoding that re-runs the whole sequence for every token."""
    stop = StopRule(stop, model.config.vocab_size, tokenizer)
    was_training = model.training
    model.eval()
    tokens = prompt.to(next(model.parameters()).device)
    new: list[int] = []
    while len(new) < max_new_tokens and not stop.reached(new):
        new.append(int(model(tokens[None])[0, -1].argmax()))
        tokens = torch.cat([tokens, tokens.new_tensor(new[-1:])])
    model.train(was_training)
    return torch.tensor(new, dtype=torch.long)
