"""Drawing a token: the inverse-CDF draw against a token-by-token walk, its frequencies, and the
top-k / top-p restrictions of ``choose_tokens``."""

import pytest
import torch
from conftest import LENGTHS

from tokenmix.generation import choose_tokens
from tokenmix.generation.sampling import inverse_cdf_draw, naive_inverse_cdf_draw


def _probabilities(rows: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    """Rows of probabilities with about a third of the tokens impossible (never all of a row's)."""
    probabilities = torch.rand(rows, vocab, generator=generator, dtype=torch.float64)
    probabilities[torch.rand(rows, vocab, generator=generator) < 0.35] = 0
    probabilities[:, torch.randint(0, vocab, (1,), generator=generator)] += 0.1
    return (probabilities / probabilities.sum(dim=-1, keepdim=True)).float()


@pytest.mark.parametrize("vocab", LENGTHS)
def test_the_inverse_cdf_draw_equals_walking_the_tokens_and_never_draws_an_impossible_one(vocab):
    generator = torch.Generator().manual_seed(vocab)
    probabilities = _probabilities(64, vocab, generator)
    uniforms = torch.rand(64, generator=generator, dtype=torch.float64)
    uniforms[:3] = torch.tensor([0.0, 1 - 2**-53, 0.5])  # both ends of [0, 1)
    drawn = inverse_cdf_draw(probabilities, uniforms)
    assert torch.equal(drawn, naive_inverse_cdf_draw(probabilities, uniforms))
    assert (probabilities.gather(1, drawn[:, None]) > 0).all()


def test_drawn_tokens_come_as_often_as_their_probabilities():
    generator = torch.Generator().manual_seed(0)
    probabilities = _probabilities(1, 12, generator)[0]
    draws = 40_000
    counts = torch.bincount(
        inverse_cdf_draw(probabilities.expand(draws, -1), torch.rand(draws, generator=generator, dtype=torch.float64)), minlength=12
    )
    expected = probabilities.double() * draws
    assert (counts[probabilities == 0] == 0).all()
    assert ((counts - expected).abs() <= 5 * expected.clamp_min(1).sqrt()).all(), (counts, expected)  # 5 standard deviations


def test_sampling_keeps_to_the_top_k_and_the_nucleus():
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(500, 30, generator=generator)
    generators = [torch.Generator().manual_seed(row) for row in range(500)]
    top = logits.topk(5, dim=-1).indices
    drawn = choose_tokens(logits, 1.0, 5, None, generators)
    assert (drawn[:, None] == top).any(dim=-1).all()
    ordered, order = logits.softmax(dim=-1).sort(dim=-1, descending=True)
    nucleus = (ordered.cumsum(dim=-1) - ordered) < 0.5  # the tokens ranked above hold less than top_p
    drawn = choose_tokens(logits, 1.0, None, 0.5, generators)
    assert nucleus.gather(1, (order == drawn[:, None]).int().argmax(dim=-1, keepdim=True)).all()
    assert len(set(drawn.tolist())) > 1
