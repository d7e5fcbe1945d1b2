"""Two contracts held over the registries: what padding leaves alone, and that no cache outlives its weights.

Padding: a row padded on a side its mixers declare (``padding_invariant_sides``) gives at its real
tokens (and, in a classifier, in its pooled summaries and class logits) the outputs of the row
alone. On an undeclared side what holds is that the padding's content does not matter; and there
the row alone does differ, so a declaration is as wide as the operator allows.

Caches: the Toeplitz mixers keep their spectrum without autograd and their decoding taps
(``ToeplitzStreaming._tile_kernels``) in ``mixers.cache.Cache``, keyed by the parameters' storage
and version (``weight_versions``). After the
weights change in place (an optimizer step, ``load_state_dict``, a dtype round trip), the eval
forward equals that of a freshly built twin with the new weights, and a fresh stream that forward.
"""

import pytest
import torch
import torch.nn.functional as F
from conftest import random_chunks, relative_error
from test_contracts import DIM, MODEL_TASKS, MODES, mixer, model
from test_streaming import TOLERANCE, model_step, prompt_then_tokens, smallest_model, streamed

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


# --- caches after the weights change -------------------------------------------------------------
HORIZON = 131  # every stream's max_length, odd: each stream is compared with the forward over all of it
STREAMS = ((7, random_chunks), (33, prompt_then_tokens), (HORIZON, random_chunks))  # their lags cross the tap cache's 64, 128, 256
WEIGHTED_MODES = [(name, causal) for name, causal in MODES if list(mixer(name, causal).parameters())]


def adamw_step(net, build) -> None:
    torch.optim.AdamW(net.parameters(), lr=0.05).step()


CHANGES = (  # each changes the weights of the same Parameter objects, under filled caches
    ("an AdamW step", adamw_step),
    ("load_state_dict of other weights", lambda net, build: net.load_state_dict(build().state_dict())),
    ("to(torch.float64)", lambda net, build: net.to(torch.float64)),
    ("an AdamW step in float64", adamw_step),
    ("to(torch.float32)", lambda net, build: net.to(torch.float32)),
)


def assert_no_stale_cache(net, build, inputs, stepper, when: str) -> None:
    """The eval forward equals that of a fresh twin with net's weights, and so do fresh streams through
    ``stepper(net)`` (None: net does not stream); running them fills net's caches for the next change."""
    dtype = next(net.parameters()).dtype
    x, step = inputs(dtype), stepper(net)
    twin = build().to(dtype).eval()
    twin.load_state_dict(net.state_dict())
    with torch.no_grad():
        expected = twin(x)
        error = relative_error(net(x), expected)
        assert error <= TOLERANCE[dtype], f"eval forward {when}: relative error {error:.3g}"
        for length, chunking in STREAMS if step else ():
            state = net.init_state(x.shape[0], dtype=dtype, max_length=HORIZON)
            error = relative_error(streamed(step, x[:, :length], chunking(length), state)[0], expected[:, :length])
            assert error <= TOLERANCE[dtype], f"stream of {length} tokens {when}: relative error {error:.3g}"


def assert_weight_changes_reach_every_cache(build, inputs, loss, stepper) -> None:
    """``inputs(dtype)``: a batch for a module of that dtype; ``loss(net, inputs)``: a training loss."""
    net = build().eval()
    for label, change in CHANGES:
        net.zero_grad(set_to_none=True)
        loss(net.train(), inputs(next(net.parameters()).dtype)).backward()  # a training forward drops the eval caches...
        assert_no_stale_cache(net.eval(), build, inputs, stepper, f"before {label}")  # ...which this fills again
        change(net, build)
        assert_no_stale_cache(net, build, inputs, stepper, f"after {label}")


@pytest.mark.parametrize(("name", "causal"), WEIGHTED_MODES)
def test_mixer_caches_follow_weights_changed_in_place(name, causal):
    """Fails if ``p._version`` leaves ``weight_versions``, the key of every weight-derived cache (after an AdamW
    step a stream applies the old taps, the eval forward the old spectrum)."""
    x = torch.randn(2, HORIZON, DIM)
    assert_weight_changes_reach_every_cache(
        lambda: mixer(name, causal),
        lambda dtype: x.to(dtype),
        lambda net, x: F.mse_loss(net(x), x.roll(1, dims=1)),  # learn to repeat the previous input
        lambda net: net.step if net.causal else None,
    )


def cross_entropy(net, tokens: torch.Tensor) -> torch.Tensor:
    """The model's logits (next or masked tokens, or classes) against labels drawn once."""
    logits = net(tokens)
    labels = torch.randint(0, logits.shape[-1], logits.shape[:-1], generator=torch.Generator().manual_seed(0))
    return F.cross_entropy(logits.flatten(0, -2), labels.flatten())


@pytest.mark.parametrize(("name", "task"), MODEL_TASKS)
def test_model_caches_follow_weights_changed_in_place(name, task):
    """Fails as the mixers' test does, through the blocks: stale taps show in an LM's stream, a stale
    spectrum in the eval forward of every task. The model is ``smallest_model``: every kind of block the
    test's ``model`` has, each with its caches, at width 8 and (but fnet_ar_xl) one layer."""
    tokens = torch.randint(0, 20, (2, HORIZON))
    assert_weight_changes_reach_every_cache(
        lambda: smallest_model(name, task),
        lambda dtype: tokens,
        cross_entropy,
        lambda net: model_step(net) if net.config.task == "lm" else None,
    )
