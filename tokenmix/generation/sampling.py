"""Choosing the next token from logits: greedy, or sampled with temperature, top-k and top-p, each row
from its own generator seeded by (seed, row), so what a row samples does not depend on the others
(one uniform draw per token, by the inverse of the cumulative distribution)."""

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
    uniforms = torch.stack([torch.rand((), dtype=torch.float64, generator=generator) for generator in generators])
    return inverse_cdf_draw(probabilities, uniforms).to(logits.device)


def inverse_cdf_draw(probabilities: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Row r's token: the first whose cumulative probability (float64) exceeds ``uniforms[r]`` (in [0, 1))
    times the row's total, for every row at once; a token of probability zero is never drawn
    (``naive_inverse_cdf_draw``: the reference). One uniform per row from its own generator, then
    one search: a ``torch.multinomial`` call per row cost about 13 us, a tenth of a 64-row decoding
    step of the demo model."""
    cumulative = probabilities.double().cumsum(dim=-1)
    drawn = torch.searchsorted(cumulative, uniforms.double()[:, None] * cumulative[:, -1:], right=True)[:, 0]
    last_possible = probabilities.shape[-1] - 1 - (probabilities.flip(-1) > 0).int().argmax(dim=-1)  # round-off at the top
    return torch.minimum(drawn, last_possible)


def naive_inverse_cdf_draw(probabilities: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Reference (tests only): ``inverse_cdf_draw`` by walking each row's tokens in order."""
    tokens = []
    for row, uniform in zip(probabilities.double().tolist(), uniforms.double().tolist(), strict=True):
        target, total = uniform * sum(row), 0.0
        chosen = max(index for index, probability in enumerate(row) if probability > 0)
        for index, probability in enumerate(row):
            total += probability
            if total > target:
                chosen = index
                break
        tokens.append(chosen)
    return torch.tensor(tokens, dtype=torch.long)
