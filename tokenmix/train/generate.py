"""Autoregressive generation from a causal LM, with the model's streaming state.

``generate`` reads the prompts once (a prefill of the length they share, in one call), then adds
one token per call: each row's remaining prompt tokens are fed as given, and once a row's prompt
is used up its next token is chosen from the logits (greedy at temperature 0, else sampled with
top-k / top-p). Rows that have all their tokens or hit their stop leave the batch
(``state.select``). Each row samples from its own generator, seeded from (seed, row), and draws
only for its own new tokens, so what a row samples does not depend on the other prompts, the
batch size, or streaming one prompt at a time. ``naive_generate`` re-runs the whole sequence for
every token: the reference the tests hold ``generate`` to.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from ..data.corpus import BYTE_VOCAB
from ..data.tokenizer import Tokenizer, byte_tokenizer
from ..progress import progress_bar
from ..validation import check_int, check_number

Stop = int | str | Sequence[int] | None


def check_sampling(temperature, top_k, top_p, seed) -> None:
    """ValueError naming the argument unless the sampling options are valid (every generation path checks them)."""
    check_number(temperature, "temperature (0 means greedy)", minimum=0)
    if top_k is not None:
        check_int(top_k, "top_k")
    if top_p is not None:
        check_number(top_p, "top_p", minimum=0, maximum=1, open_minimum=True)
    if seed is not None:
        check_int(seed, "seed", minimum=0)


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
    return list(prompts), rows


def row_generator(seed: int, row: int) -> torch.Generator:
    """The sampling generator of row ``row`` under ``seed``: seeded from the pair (numpy's SeedSequence mixes them)."""
    return torch.Generator().manual_seed(int(np.random.SeedSequence([seed, row]).generate_state(1, np.uint64)[0] >> 1))


def stop_ids(stop: Stop, vocab_size: int) -> list[int] | None:
    """The token ids that end a row: a token id or a non-empty list of them."""
    if stop is None:
        return None
    ids = [stop] if isinstance(stop, int) and not isinstance(stop, bool) else list(stop)
    if not ids or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < vocab_size for i in ids):
        raise ValueError(f"stop must be a token id in [0, {vocab_size}), a non-empty list of them, or a string; got {stop!r}")
    return ids


class StopRule:
    """When a row is done: its ids end with the stop ids, or (a string) the text its ids decode to
    contains the stop text. Token boundaries of a BPE need not fall where the text does, so the row
    ends with the token that completes the string; ``cut`` trims the text after it."""

    def __init__(self, stop: Stop, vocab_size: int, tokenizer: Tokenizer | None = None):
        self.ids, self.text = None, None
        if isinstance(stop, str):
            if tokenizer is None and vocab_size != BYTE_VOCAB:
                raise ValueError(f"stop as a string needs the model's tokenizer (vocabulary {vocab_size}, not bytes): pass tokenizer=")
            if not stop:
                raise ValueError("stop must not be an empty string")
            self.text, self.token_bytes = stop.encode(), (tokenizer or byte_tokenizer()).token_bytes
        else:
            self.ids = stop_ids(stop, vocab_size)

    def reached(self, tokens: list[int]) -> bool:
        if self.ids is not None:
            return len(tokens) >= len(self.ids) and tokens[len(tokens) - len(self.ids) :] == self.ids
        if self.text is None or not tokens:
            return False
        # Not found before the last token: a match ends inside its bytes, so a tail this long holds it.
        needed, tail = len(self.text) - 1 + len(self.token_bytes[tokens[-1]]), []
        for token in reversed(tokens):
            tail.append(self.token_bytes[token])
            needed -= len(tail[-1])
            if needed <= 0:
                break
        return self.text in b"".join(reversed(tail))

    def cut(self, text: bytes) -> bytes:
        """``text`` up to the end of the first stop string in it (all of it for id stops or none found)."""
        found = -1 if self.text is None else text.find(self.text)
        return text if found < 0 else text[: found + len(self.text)]


def choose_tokens(
    logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None, generators: Sequence[torch.Generator | None]
) -> torch.Tensor:
    """One token per row of logits (rows, vocab): the argmax at temperature 0, else a sample from
    softmax(logits / temperature) restricted to the top_k most likely and the smallest set whose
    probability reaches top_p (nucleus sampling, Holtzman et al. 2020), drawn with each row's own
    generator (None: torch's global one)."""
    if logits.shape[0] == 0:
        return torch.zeros(0, dtype=torch.long, device=logits.device)
    logits = logits.float()
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        threshold = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < threshold, float("-inf"))
    if top_p is not None and top_p < 1:
        ordered, order = logits.sort(dim=-1, descending=True)
        before = ordered.softmax(dim=-1).cumsum(dim=-1) - ordered.softmax(dim=-1)  # probability of the tokens ranked above
        ordered = ordered.masked_fill(before >= top_p, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, ordered)
    probabilities = torch.softmax(logits, dim=-1).cpu()
    drawn = [torch.multinomial(row, 1, generator=generator) for row, generator in zip(probabilities, generators, strict=True)]
    return torch.cat(drawn).to(logits.device)


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
    segment_length: int | None = None,
    on_token: Callable[[int, int], None] | None = None,
    tokenizer: Tokenizer | None = None,
    progress: bool = False,
) -> list[torch.Tensor]:
    """The new token ids of each prompt (1-D id tensors of any lengths), decoded with the model's state.

    ``stop``: a token id or a list of ids that ends a row (its ids end with them), or a string: the
    row ends with the token that completes it in the decoded text (``StopRule``; ``tokenizer``
    decodes, bytes by default). ``seed`` fixes the sampling: prompt i samples with the generator of
    (seed, rows[i]) (``rows`` default 0, 1, ...), so a prompt generated alone with ``rows=[i]`` gets
    what it gets as row i of a batch. ``segment_length``: the segment of XL models' memory (default:
    none, the whole stream is one segment). ``on_token(row, id)`` is called for every new token as
    it is chosen (streaming output); ``progress`` shows a bar of the tokens made.
    """
    prompts, rows = _check_options(model, prompts, max_new_tokens, rows)
    check_sampling(temperature, top_k, top_p, seed)
    stop = StopRule(stop, model.config.vocab_size, tokenizer)
    generators = [None if seed is None else row_generator(seed, row) for row in rows]
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    lengths = [prompt.numel() for prompt in prompts]
    new: list[list[int]] = [[] for _ in prompts]
    shared = min(lengths)
    state = model.init_state(len(prompts), device, max_length=max(lengths) + max_new_tokens, segment_length=segment_length)
    logits, state = model(torch.stack([prompt[:shared] for prompt in prompts]).to(device), state=state, return_state=True)
    active, position = list(range(len(prompts))), shared  # prompts still in the batch; tokens read so far
    bar = progress_bar(total=len(prompts) * max_new_tokens, unit="token", desc="generating", disable=not progress)
    while active and max_new_tokens:
        sampling = [slot for slot, index in enumerate(active) if position >= lengths[index]]  # rows past their prompt
        picks = choose_tokens(logits[sampling, -1], temperature, top_k, top_p, [generators[active[slot]] for slot in sampling])
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
            state = state.select(kept)
            inputs = [inputs[slot] for slot in kept]
        logits, state = model(torch.tensor(inputs, device=device)[:, None], state=state, return_state=True)
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
