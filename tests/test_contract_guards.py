"""Contracts held over the registries: what padding leaves alone.

Padding: a row padded on a side its mixers declare (``padding_invariant_sides``) gives at its real
tokens (and, in a classifier, in its pooled summaries and class logits) the outputs of the row
alone. On an undeclared side what holds is that the padding's content does not matter; and there
the row alone does differ, so a declaration is as wide as the operator allows.
"""

import pytest
import torch
from conftest import relative_error
from test_contracts import DIM, MODEL_TASKS, MODES, mixer, model

from tokenmix.mixers.base import PADDING_SIDES
from tokenmix.models.config import POOLS
from tokenmix.models.model import pool_hidden

# --- padding -------------------------------------------------------------------------------------
LENGTH, PAD = 141, 11  # odd; past a chunk of 128 and a SKI rank of 64, so a dependence on the length or on positions shows
EXACT = 1e-6  # relative, float64: rotary angles are rounded to float32 even there
DEPENDS = 1e-9  # relative, float64: a difference this large is the operator's, not round-off
DECLARATION_OPTIONS = {"tcn": {"dilation_factor": "auto"}, "attention": {"chunk_size": 8}}  # each changes what the mixer declares


def variant(name: str, mode, **options):
    return pytest.param(name, mode, options, id="-".join([name, str(mode), *(f"{key}={value}" for key, value in options.items())]))


MIXER_VARIANTS = [variant(name, causal) for name, causal in MODES] + [
    variant(name, causal, **DECLARATION_OPTIONS[name]) for name, causal in MODES if name in DECLARATION_OPTIONS
]
MODEL_VARIANTS = [variant(name, task) for name, task in MODEL_TASKS] + [  # and a TNN block around every mixer
    variant("tnn", "lm" if causal else "mlm", mixer=name) for name, causal in MODES
]


def padded_batch(row: torch.Tensor, junk: torch.Tensor, side: str, neighbour: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, mask): row 0 is ``row`` (1, n, ...) with ``junk`` (1, pad, ...) on ``side``, row 1 a whole ``neighbour``."""
    n, pad = row.shape[1], junk.shape[1]
    mask = torch.ones(2, n + pad, dtype=torch.bool)
    mask[0, slice(n, None) if side == "right" else slice(0, pad)] = False
    inputs = torch.cat([torch.cat([row, junk] if side == "right" else [junk, row], dim=1), neighbour])
    return inputs, mask


def assert_padding_as_declared(views, declared: tuple[str, ...], side: str, make) -> None:
    """``views(inputs, mask)``: what row 0 yields (its outputs at real positions first); ``make(n)``: a (1, n, ...) row."""
    row, neighbour = make(LENGTH), make(LENGTH + PAD)
    with torch.no_grad():
        alone = views(row, None)
        padded = views(*padded_batch(row, make(PAD), side, neighbour))
        if side in declared:
            for a, b in zip(padded, alone, strict=True):
                assert relative_error(a, b) <= EXACT, f"{side} padding changes a row's outputs: {relative_error(a, b):.3g}"
            return
        other_content = views(*padded_batch(row, make(PAD), side, neighbour))
        for a, b in zip(padded, other_content, strict=True):
            torch.testing.assert_close(a, b)
        assert relative_error(padded[0], alone[0]) > DEPENDS, f"exact under {side} padding: declare {side!r} in padding_invariant_sides"


def mixer_views(layer):
    def views(x, mask):
        y = layer(x, mask)
        return [y[0] if mask is None else y[0, mask[0]]]

    return views


def model_views(net):
    """Hidden states at real positions; a classifier's pooled summaries (every pooling) and class logits too."""

    def views(tokens, mask):
        h, _ = net.hidden_states(tokens, mask)
        outputs = [h[0] if mask is None else h[0, mask[0]]]
        if net.config.task == "classify":
            outputs += [pool_hidden(h, mask, how)[0] for how in POOLS] + [net(tokens, mask)[0]]
        return outputs

    return views


@pytest.mark.parametrize("side", PADDING_SIDES)
@pytest.mark.parametrize(("name", "causal", "options"), MIXER_VARIANTS)
def test_mixer_padding_leaves_a_row_as_alone_on_the_sides_it_declares(name, causal, options, side):
    """Fails if padding reaches real tokens on a declared side: e.g. with tcn.py's ``mix`` no longer zeroing
    padding before each convolution, the biases computed at padded positions do (left padding, or right
    padding when bidirectional). Fails too if a declaration claims a side its operator depends on, or misses one."""
    layer = mixer(name, causal, **options).double().eval()
    make = lambda n: torch.randn(1, n, DIM, dtype=torch.float64)  # noqa: E731
    assert_padding_as_declared(mixer_views(layer), layer.padding_invariant_sides, side, make)


@pytest.mark.parametrize("side", PADDING_SIDES)
@pytest.mark.parametrize(("name", "task", "options"), MODEL_VARIANTS)
def test_model_padding_leaves_a_row_as_alone_on_the_sides_its_mixers_declare(name, task, options, side):
    """Fails as the mixers' test does, at a model's hidden states, pooled summaries and class logits (e.g. those
    of TCN models with tcn.py's convolutions no longer zeroing padding); or if a block answers wrongly for its parts."""
    net = model(name, task, **options).double().eval()
    assert_padding_as_declared(model_views(net), net.padding_invariant_sides, side, lambda n: torch.randint(0, 20, (1, n)))
