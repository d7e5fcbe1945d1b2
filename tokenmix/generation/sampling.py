"""Choosing the next token from logits: greedy, or sampled with temperature, top-k and top-p, each row
from its own generator seeded by (seed, row), so what a row samples does not depend on the others."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..validation import check_int, check_number


def check_sampling(temperature, top_k, top_p, seed) -> None:
    """ValueError naming the argument unless the sampling options are valid (every generation path checks them)."""
    check_number(temperature, "temperature (0 means greedy)", minimum=0)
    if top_k is not None:
        check_int(top_k, "top_k")
    if top_p is not None:
        check_number(top_p, "top_p", minimum=0, maximum=1, open_minimum=True)
    if seed is not None:
        check_int(seed, "seed", minimum=0)


def row_generator(seed: int, row: int) -> torch.Generator:
    """The sampling generator of row ``row`` under ``seed``: seeded from the pair (numpy's SeedSequence mixes them)."""
    return torch.Generator().manual_seed(int(np.random.SeedSequence([seed, row]).generate_state(1, np.uint64)[0] >> 1))


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
