"""Properties every mixer and every model must have, one parametrized test each over the registries.

A new mixer or model is covered by adding it to ``list_mixers()`` / ``list_models()``; the
families' own tests check what is particular to them (dense references, kernels, options).
"""

import copy
import io
import pickle

import pytest
import torch
from conftest import LENGTHS, assert_causal_gradient, relative_error

import tokenmix
from tokenmix.blocks.mega import sequence_mixers
from tokenmix.mixers.base import SEQUENCE_SPLITS, zero_padding
from tokenmix.mixers.registry import mixer_class, resolve_mixer_options
from tokenmix.models.config import POOLS
from tokenmix.models.registry import model_spec, resolve_model_options
from tokenmix.train.optim import parameter_groups

DIM = 8
MODES = [(name, causal) for name in tokenmix.list_mixers() for causal in mixer_class(name).causal_modes]
CAUSAL = [name for name, causal in MODES if causal]
MODEL_TASKS = [(name, task) for name in tokenmix.list_models() for task in model_spec(name).tasks]
LM_MODELS = [name for name, task in MODEL_TASKS if task == "lm"]
CLASSIFIERS = [name for name, task in MODEL_TASKS if task == "classify"]  # their default pool is tested with every task
SMALL = {  # small enough that float64 gradient checks stay fast; any other values would do
    "tno": {"rpe_dim": 4, "rpe_layers": 1},
    "tno2d": {"rpe_dim": 4, "rpe_layers": 1},
    "separable2d": {"rpe_dim": 4, "rpe_layers": 1},
    "fd_tno": {"rpe_dim": 4, "rpe_layers": 1},
    "ski_tno": {"rank": 3, "knots": 2, "filter_size": 3},
    "ema": {"ndim": 2},
    "tcn": {"depth": 2, "kernel_size": 3},
}


def mixer(name, causal, dim=DIM, **options):
    return tokenmix.build_mixer(name, dim, causal, **{**SMALL.get(name, {}), **options})


def model(name, task="lm", **options):
    """A small model; chunked attention (where the model has it) gets chunks shorter than the test sequences."""
    extra = {"num_classes": 3} if task == "classify" else {}
    if "chunk_size" in resolve_model_options(name, {}, dim=16, depth=2):
        extra["chunk_size"] = 8
    return tokenmix.build_model(name, task=task, vocab_size=20, dim=16, depth=2, **extra, **options)


def padded_pair(batch_shape, make):
    """(x, other, mask): ``other`` differs from x at padded positions only (right padding in row 0, left in row 1)."""
    x = make()
    mask = torch.ones(batch_shape, dtype=torch.bool)
    mask[0, batch_shape[1] - 7 :] = False
    mask[1, :5] = False
    other = x.clone()
    other[~mask] = make()[~mask] * 100 if x.is_floating_point() else make()[~mask]
    return x, other, mask


# --- mixers --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "causal"), MODES)
@pytest.mark.parametrize("n", LENGTHS)
def test_mixer_takes_any_length(name, causal, n):
    y = mixer(name, causal)(torch.randn(2, n, DIM))
    assert y.shape == (2, n, DIM) and torch.isfinite(y).all()


@pytest.mark.parametrize("name", CAUSAL)
@pytest.mark.parametrize("n", [7, 100])
def test_causal_mixer_output_depends_on_the_past_only(name, n):
    layer = mixer(name, True).double()
    x = torch.randn(2, n, DIM, dtype=torch.float64, requires_grad=True)
    position = n // 2
    (grad,) = torch.autograd.grad(layer(x)[:, position].sum(), x)
    assert_causal_gradient(grad, position)


@pytest.mark.parametrize("name", [name for name, causal in MODES if not causal])
def test_bidirectional_mixer_sees_the_future(name):
    x = torch.randn(1, 40, DIM, requires_grad=True)
    (grad,) = torch.autograd.grad(mixer(name, False)(x)[:, 10].sum(), x)
    assert grad[:, 11:].abs().sum() > 0


@pytest.mark.parametrize(("name", "causal"), MODES)
def test_mixer_padding_cannot_reach_real_tokens(name, causal):
    layer = mixer(name, causal)
    x, other, mask = padded_pair((2, 60), lambda: torch.randn(2, 60, DIM))
    torch.testing.assert_close(layer(x, mask)[mask], layer(other, mask)[mask])


@pytest.mark.parametrize(("name", "causal"), MODES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_mixer_output_has_the_input_dtype(name, causal, dtype):
    """A float32 module takes bfloat16 and float64 input; a bfloat16 module takes bfloat16 input."""
    layer = mixer(name, causal)
    x = torch.randn(2, 50, DIM)
    reference = layer(x)
    y = layer(x.to(dtype))
    assert y.dtype == dtype and relative_error(y.float(), reference) < (5e-2 if dtype == torch.bfloat16 else 1e-5)
    if dtype == torch.bfloat16:
        half = layer.to(dtype)(x.to(dtype))
        assert half.dtype == dtype and torch.isfinite(half.float()).all()


@pytest.mark.parametrize(("name", "causal"), MODES)
def test_mixer_takes_an_empty_batch(name, causal):
    x = torch.randn(0, 9, DIM, requires_grad=True)
    y = mixer(name, causal)(x, torch.ones(0, 9, dtype=torch.bool))
    assert y.shape == (0, 9, DIM)
    y.sum().backward()


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda m: m(torch.randn(9, DIM)), "batch, length, dim"),
        (lambda m: m(torch.randn(1, 9, DIM + 1)), "channels"),
        (lambda m: m(torch.randn(1, 0, DIM)), "length >= 1"),
        (lambda m: m(torch.randint(0, 3, (1, 9, DIM))), "floating point"),
        (lambda m: m(torch.randn(1, 9, DIM), torch.ones(1, 9)), "bool"),
        (lambda m: m(torch.randn(1, 9, DIM), torch.ones(1, 8, dtype=torch.bool)), "shape"),
        (lambda m: m(torch.randn(1, 3, DIM), [[True, True, False]]), "torch.Tensor"),
    ],
)
@pytest.mark.parametrize(("name", "causal"), MODES)
def test_mixer_refuses_bad_input(name, causal, call, message):
    with pytest.raises(ValueError, match=message):
        call(mixer(name, causal))


@pytest.mark.parametrize("name", tokenmix.list_mixers())
def test_unknown_mixer_option_names_every_accepted_one(name):
    accepted = resolve_mixer_options(name, {}, DIM)
    with pytest.raises(ValueError, match="unknown option 'no_such_option'") as raised:
        tokenmix.build_mixer(name, DIM, mixer_class(name).causal_modes[0], no_such_option=1)
    assert all(option in str(raised.value) for option in accepted)


@pytest.mark.parametrize("name", tokenmix.list_mixers())
def test_resolved_mixer_options_rebuild_the_same_mixer(name):
    causal = mixer_class(name).causal_modes[0]
    resolved = resolve_mixer_options(name, SMALL.get(name, {}), DIM)
    assert resolve_mixer_options(name, resolved, DIM) == resolved
    assert not {key for key, value in resolved.items() if value is None} & {"heads", "max_distance"}  # derived defaults pinned
    torch.manual_seed(1)
    first = tokenmix.build_mixer(name, DIM, causal, **SMALL.get(name, {}))
    torch.manual_seed(1)
    second = tokenmix.build_mixer(name, DIM, causal, **resolved)
    x = torch.randn(1, 20, DIM)
    torch.testing.assert_close(first(x), second(x))


@pytest.mark.parametrize(("name", "causal"), MODES)
def test_mixer_survives_pickle_and_deepcopy(name, causal):
    layer = mixer(name, causal).eval()
    x = torch.randn(2, 30, DIM)
    expected = layer(x)
    buffer = io.BytesIO()
    torch.save(layer, buffer)  # pickles the module
    for clone in (pickle.loads(pickle.dumps(layer)), copy.deepcopy(layer)):
        torch.testing.assert_close(clone(x), expected)


@pytest.mark.parametrize(("name", "causal"), MODES)
def test_finite_check_refuses_nan_at_real_positions_only(name, causal):
    layer = mixer(name, causal)
    x = torch.randn(2, 20, DIM)
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[1, 15:] = False
    x[1, 17, 3] = float("nan")  # padding: zeroed before mixing
    with tokenmix.check_finite_inputs():
        assert torch.isfinite(layer(x, mask)[mask]).all()
        x[0, 12, 0] = float("inf")
        with pytest.raises(ValueError, match="batch 0, position 12"):
            layer(x, mask)
    layer(x, mask)  # off again outside the context


# --- models --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "task"), MODEL_TASKS)
def test_model_runs_every_task_it_supports(name, task):
    tokens, _, mask = padded_pair((2, 33), lambda: torch.randint(0, 20, (2, 33)))
    out = model(name, task)(tokens, mask)
    assert out.shape == ((2, 3) if task == "classify" else (2, 33, 20)) and torch.isfinite(out).all()


@pytest.mark.parametrize("name", LM_MODELS)
def test_language_model_depends_on_the_past_only(name):
    lm = model(name).double()
    tokens = torch.randint(0, 20, (1, 40))
    embedded = lm.embedding(tokens).detach().requires_grad_()
    lm.embedding.forward = lambda _tokens: embedded  # differentiate w.r.t. the embedded inputs
    (grad,) = torch.autograd.grad(lm(tokens)[:, 21].sum(), embedded)
    assert_causal_gradient(grad, 21)


@pytest.mark.parametrize(("name", "task"), MODEL_TASKS)
def test_model_padding_cannot_reach_real_tokens(name, task):
    net = model(name, task).eval()
    tokens, other, mask = padded_pair((2, 30), lambda: torch.randint(0, 20, (2, 30)))
    a, b = net(tokens, mask), net(other, mask)
    torch.testing.assert_close(a if task == "classify" else a[mask], b if task == "classify" else b[mask])


@pytest.mark.parametrize("documents", [1, 2])
@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("name", CLASSIFIERS)
def test_classifier_padding_cannot_reach_the_class(name, pool, documents):
    """Every pooling, one document per example or the dual encoder's two."""
    net = model(name, "classify", pool=pool, documents=documents).eval()
    tokens, other, mask = padded_pair((2, 30), lambda: torch.randint(0, 20, (2, 30)))
    if documents == 2:  # each example's second document is the other row's
        tokens, other, mask = (torch.stack([t, t.flip(0)], dim=1) for t in (tokens, other, mask))
    torch.testing.assert_close(net(other, mask), net(tokens, mask))


@pytest.mark.parametrize(("name", "task"), MODEL_TASKS)
def test_model_save_load_round_trip_is_exact(name, task, tmp_path):
    net = model(name, task).eval()
    net.save_pretrained(tmp_path / "saved")
    loaded = tokenmix.open_run(tmp_path / "saved").model.eval()
    assert loaded.config == net.config
    tokens = torch.randint(0, 20, (2, 11))
    torch.testing.assert_close(loaded(tokens), net(tokens), rtol=0, atol=0)


@pytest.mark.parametrize("name", tokenmix.list_models())
def test_model_survives_pickle_and_deepcopy(name):
    net = model(name, model_spec(name).tasks[0]).eval()
    tokens = torch.randint(0, 20, (2, 11))
    expected = net(tokens)
    for clone in (pickle.loads(pickle.dumps(net)), copy.deepcopy(net)):
        torch.testing.assert_close(clone(tokens), expected)


@pytest.mark.parametrize("name", tokenmix.list_models())
def test_unknown_model_option_names_every_accepted_one(name):
    net = model(name, model_spec(name).tasks[0])
    with pytest.raises(ValueError, match="unknown option 'no_such_option'") as raised:
        model(name, model_spec(name).tasks[0], no_such_option=1)
    assert all(option in str(raised.value) for option in net.config.options.as_dict())


@pytest.mark.parametrize("name", tokenmix.list_models())
def test_model_takes_an_empty_batch(name):
    task = model_spec(name).tasks[0]
    out = model(name, task)(torch.zeros(0, 9, dtype=torch.long))
    assert out.shape[0] == 0


@pytest.mark.parametrize("name", tokenmix.list_models())
def test_weight_decay_reaches_linear_weights_only(name):
    """Kernel parameters (EMA coefficients, SKI knots and taps, TCN taps, q/k scales) and the tied
    embedding are exempt; every decayed parameter is the weight of a linear map."""
    net = model(name, model_spec(name).tasks[0])
    decayed, plain = (group["params"] for group in parameter_groups(net, 0.1))
    linear_weights = {id(module.weight) for module in net.modules() if isinstance(module, torch.nn.Linear)}
    assert {id(p) for p in decayed} == linear_weights - {id(net.embedding.weight)}
    assert len(decayed) + len(plain) == len(list(net.parameters()))


@pytest.mark.parametrize(("name", "causal"), MODES)
def test_mixer_trains_with_input_and_module_dtypes_that_differ(name, causal):
    """A float32 module takes float64 input through backward; a module made float64 after a float32 step trains in float64."""
    layer = mixer(name, causal)
    x = torch.randn(2, 30, DIM, dtype=torch.float64, requires_grad=True)
    layer(x).square().sum().backward()
    assert x.grad.dtype == torch.float64 and all(p.grad.dtype == torch.float32 for p in layer.parameters())
    layer.zero_grad(set_to_none=True)
    layer.double()  # after a float32 step: nothing cached may keep float32
    x = torch.randn(2, 30, DIM, dtype=torch.float64, requires_grad=True)
    layer(x).square().sum().backward()
    assert all(p.grad.dtype == torch.float64 and torch.isfinite(p.grad).all() for p in layer.parameters())


@pytest.fixture
def blocked_layout(monkeypatch):
    """Send every FFT input through the blocked transposes (normally for large tensors only)."""
    from tokenmix.ops import layout

    monkeypatch.setattr(layout, "MIN_BLOCKED_ELEMENTS", 0)
    monkeypatch.setattr(layout, "TOKEN_BLOCK", 16)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize(("name", "causal"), MODES)
def test_blocked_transposes_change_nothing_in_any_mode(name, causal, blocked_layout):
    layer = mixer(name, causal).double()
    x = torch.randn(3, 50, DIM, dtype=torch.float64, requires_grad=True)
    y = layer(x)
    grads = torch.autograd.grad(y.square().sum(), [x, *layer.parameters()])
    from tokenmix.ops import layout

    layout.MIN_BLOCKED_ELEMENTS = 1 << 62  # the plain copy, as reference
    y_plain = layer(x)
    grads_plain = torch.autograd.grad(y_plain.square().sum(), [x, *layer.parameters()])
    torch.testing.assert_close(y, y_plain, rtol=0, atol=0)
    for a, b in zip(grads, grads_plain, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    layout.MIN_BLOCKED_ELEMENTS = 0
    with torch.inference_mode():
        torch.testing.assert_close(layer.eval()(x.detach()), y_plain.detach(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("name", "causal"), MODES)
def test_every_mixer_works_inside_the_tnn_block(name, causal, tmp_path):
    """The GTU builds any registered mixer by name (``-o mixer=NAME``); the options stay apart and reload."""
    task = "lm" if causal else "mlm"
    net = tokenmix.build_model("tnn", task=task, vocab_size=20, dim=8, depth=2, mixer=name, options=SMALL.get(name, {})).eval()
    tokens = torch.randint(0, 20, (2, 17))
    net.save_pretrained(tmp_path)
    torch.testing.assert_close(tokenmix.open_run(tmp_path).model.eval()(tokens), net(tokens), rtol=0, atol=0)


@pytest.mark.parametrize(("name", "causal"), [(name, causal) for name, causal in MODES if mixer_class(name).channelwise_linear])
def test_a_channelwise_linear_mixer_is_linear_in_each_channel_alone(name, causal):
    """What ``channelwise_linear`` declares: superposition holds, and a channel's outputs ignore the other channels."""
    layer = mixer(name, causal).double()
    x, y = (torch.randn(2, 36, DIM, dtype=torch.float64) for _ in range(2))
    with torch.no_grad():
        torch.testing.assert_close(layer(2 * x - 3 * y), 2 * layer(x) - 3 * layer(y), rtol=1e-10, atol=1e-10)
        others = x.clone()
        others[..., 1:] = y[..., 1:]
        torch.testing.assert_close(layer(others)[..., 0], layer(x)[..., 0], rtol=1e-12, atol=1e-12)


REACH_OPTIONS = {"fnet_ar": {"window": 8}, "chunked_attention": {"chunk_size": 8}}  # reaches shorter than the test sequence


@pytest.mark.parametrize(("name", "causal"), MODES)
def test_reach_is_exactly_as_far_as_outputs_depend(name, causal):
    """``reach`` (behind, ahead) bounds which inputs an output depends on, and some output uses both
    ends of it; a mixer without a finite reach lets the first token reach the last."""
    layer = mixer(name, causal, **REACH_OPTIONS.get(name, {})).double()
    n = 40
    x = torch.randn(1, n, DIM, dtype=torch.float64, requires_grad=True)
    y = layer(x)
    behind = ahead = 0
    for i in range(n):
        (grad,) = torch.autograd.grad(y[0, i].sum(), x, retain_graph=True)
        strength = grad[0].abs().sum(-1)
        seen = (strength > 1e-12 * strength.max()).nonzero().flatten()
        behind, ahead = max(behind, i - int(seen.min())), max(ahead, int(seen.max()) - i)
    assert (behind, ahead) == (layer.reach or (n - 1, 0 if causal else n - 1))


@pytest.mark.parametrize(("name", "causal"), MODES)
def test_channel_independence_is_declared_exactly(name, causal):
    """``channel_independent`` is true exactly when a channel's outputs ignore the other channels."""
    layer = mixer(name, causal).double()
    x, y = (torch.randn(2, 36, DIM, dtype=torch.float64) for _ in range(2))
    others = x.clone()
    others[..., 1:] = y[..., 1:]
    with torch.no_grad():
        alone = torch.allclose(layer(others)[..., 0], layer(x)[..., 0], rtol=1e-12, atol=1e-12)
    assert alone == layer.channel_independent and (layer.channel_independent or not layer.channelwise_linear)


@pytest.mark.parametrize(("name", "causal"), MODES)
def test_sequence_split_rests_on_what_the_mixer_declares(name, causal):
    """A halo needs a finite reach, a channel split channel slices, a body the parts it runs."""
    layer = mixer(name, causal, **REACH_OPTIONS.get(name, {}))
    split = layer.sequence_split
    assert split is None or split in SEQUENCE_SPLITS
    assert (split == "halo") == (layer.reach is not None)
    assert split != "channels" or (layer.channel_slices and layer.channel_independent)
    assert split != "body" or all(part.sequence_split is not None for part in layer.stream_parts())


CHANNEL_SLICED = [(name, causal) for name, causal in MODES if mixer_class(name).channel_slices]


@pytest.mark.parametrize(("name", "causal"), CHANNEL_SLICED)
@pytest.mark.parametrize("n", LENGTHS)
def test_a_slice_of_channels_mixes_as_in_the_whole(name, causal, n):
    """``mix_channels(x[..., c], mask, c)`` is ``mix(x)[..., c]``, forward and gradient (what a channel split runs)."""
    layer = mixer(name, causal).double()
    x = torch.randn(2, n, DIM, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[1, n // 2 :] = False
    mask[0, 0] = n == 1  # row 0 starts with padding
    whole = layer(x, mask)
    upstream = torch.randn_like(whole)
    expected = torch.autograd.grad((whole * upstream).sum(), [x, *layer.parameters()])
    pieces = [slice(0, 3), slice(3, 4), slice(4, DIM)]
    got = [layer.mix_channels(zero_padding(x[..., piece], mask), mask, piece) for piece in pieces]
    for piece, y in zip(pieces, got, strict=True):
        assert relative_error(y, whole[..., piece]) < 1e-12
    total = sum((y * upstream[..., piece]).sum() for piece, y in zip(pieces, got, strict=True))
    for grad, want in zip(torch.autograd.grad(total, [x, *layer.parameters()]), expected, strict=True):
        torch.testing.assert_close(grad, want, rtol=1e-10, atol=1e-12)


HALO_MODES = [(name, causal) for name, causal in MODES if mixer(name, causal, **REACH_OPTIONS.get(name, {})).reach is not None]


@pytest.mark.parametrize(("name", "causal"), HALO_MODES)
@pytest.mark.parametrize("n", [7, 100, 128])
def test_the_halo_span_alone_gives_the_outputs_of_the_whole_sequence(name, causal, n):
    """A forward over ``halo_span(start, stop, n)`` alone gives the outputs [start, stop) of one forward over
    all n tokens (what a halo split runs), for shards anywhere, shorter and longer than the reach."""
    layer = mixer(name, causal, **REACH_OPTIONS.get(name, {})).double()
    x = torch.randn(2, n, DIM, dtype=torch.float64)
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[0, : n // 3] = False
    whole = layer(x, mask)
    for start, stop in [(0, 1), (0, n), (n // 2, n), (n // 3, n // 3 + 1), (n // 4, 3 * n // 4), (n - 1, n)]:
        begin, end = layer.halo_span(start, stop, n)
        assert 0 <= begin <= start < stop <= end <= n
        part = layer(x[:, begin:end], mask[:, begin:end])[:, start - begin : stop - begin]
        assert relative_error(part, whole[:, start:stop]) < 1e-12, (start, stop, begin, end)


@pytest.mark.parametrize("name", [name for name in tokenmix.list_mixers() if mixer_class(name).mixes_context])
def test_mixing_with_a_context_continues_the_sequence(name):
    """``mix_context(x, [before; x], real, start)`` gives the outputs at x of one forward over [before; x]."""
    layer = mixer(name, True, **REACH_OPTIONS.get(name, {})).double()
    sequence = torch.randn(2, 30, DIM, dtype=torch.float64)
    real = torch.ones(2, 30, dtype=torch.bool)
    torch.testing.assert_close(layer.mix_context(sequence[:, 17:], sequence, real, 17), layer(sequence)[:, 17:])


@pytest.mark.parametrize("name", sequence_mixers())
@pytest.mark.parametrize("causal", [False, True])
def test_every_sequence_mixer_works_inside_the_mega_block(name, causal, tmp_path):
    """MEGA's ``sequence_mixer`` (``-o sequence_mixer=NAME``) is any registered mixer ``sequence_mixers()`` lists."""
    if causal not in mixer_class(name).causal_modes:
        with pytest.raises(ValueError, match="causal"):
            tokenmix.build_model("mega", task="lm" if causal else "mlm", vocab_size=20, dim=8, depth=1, sequence_mixer=name)
        return
    net = tokenmix.build_model(
        "mega", task="lm" if causal else "mlm", vocab_size=20, dim=8, depth=2, sequence_mixer=name, chunk_size=8, z_dim=4
    )
    tokens = torch.randint(0, 20, (2, 17))
    net.eval().save_pretrained(tmp_path)
    torch.testing.assert_close(tokenmix.open_run(tmp_path).model.eval()(tokens), net(tokens), rtol=0, atol=0)
