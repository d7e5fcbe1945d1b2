"""Second derivatives (Hessian-vector products, gradient penalties) through the custom autograd Functions and every mixer.

The Toeplitz Functions (ops/toeplitz.py) build their backward from differentiable operations when
autograd records it (create_graph=True) for forwards run inside ``tokenmix.double_backward()``, and
refuse otherwise; the band convolution's and the SKI interpolation pair's backward are plain
differentiable operations. All must be exactly twice differentiable, also when the gradient reaching
them does not require grad (a loss linear in their output): the case in which a detached backward
(``@once_differentiable``) returns zeros instead of raising. Every test here but the last runs inside
``double_backward()``.

``gradgradcheck`` runs in ``fast_mode``: it compares the analytical and numerical second derivatives in
random directions (u^T J v) instead of entry by entry, which a wrong or missing entry changes as surely,
at the cost of one numerical derivative per direction instead of one per input element.
"""

import functools

import pytest
import torch
from conftest import relative_error
from test_contracts import MODES, mixer
from torch.autograd import gradgradcheck
from torch.autograd.functional import hessian, hvp
from torch.func import functional_call

import tokenmix
from tokenmix.mixers.registry import mixer_class
from tokenmix.ops.band import band_matvec, naive_band_matvec
from tokenmix.ops.fft import fast_fft_size
from tokenmix.ops.ski import (
    dense_interpolation,
    naive_ski_matrix,
    ski_dense_matvec,
    ski_linear_matvec,
    ski_sparse_matvec,
    ski_weights,
    toeplitz_blocks,
)
from tokenmix.ops.toeplitz import (
    factored_spectral_matvec,
    naive_toeplitz_matvec,
    spectral_matvec,
    toeplitz_matvec,
    toeplitz_spectrum,
)

LENGTHS = (1, 7, 8)  # one token, an odd length, a power of two


@pytest.fixture(autouse=True)
def _double_backward(request):
    if "outside" in request.node.name:
        yield
        return
    with tokenmix.double_backward():
        yield


CHANNELS = 3
TOEPLITZ_MIXERS = [(name, causal) for name, causal in MODES if mixer_class(name).toeplitz_streaming]  # products by their taps


def randn(*shape, dtype=torch.float64, requires_grad=True):
    return torch.randn(*shape, dtype=dtype, requires_grad=requires_grad)


def kernel_rows(n: int, causal: bool) -> int:
    return n if causal else 2 * n - 1


def with_parameters(layer: torch.nn.Module):
    """(function(x, *parameters) -> layer(x), copies of the parameters): the layer as a function of all its inputs."""
    names = [key for key, _ in layer.named_parameters()]

    def function(x, *values):
        return functional_call(layer, dict(zip(names, values, strict=True)), (x,))

    return function, tuple(p.detach().clone().requires_grad_() for p in layer.parameters())


# --- ops: gradgradcheck ---------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", LENGTHS)
def test_toeplitz_matvec_is_twice_differentiable(n, causal):
    """Fails if ``_SpectralConvolution.backward`` is made once differentiable or detaches its gradients."""
    x, kernel = randn(2, n, CHANNELS), randn(kernel_rows(n, causal), CHANNELS)
    assert gradgradcheck(functools.partial(toeplitz_matvec, causal=causal), (x, kernel), fast_mode=True)


@pytest.mark.parametrize("n", LENGTHS)
def test_spectral_matvec_is_twice_differentiable(n):
    """Any complex spectrum, so the Hermitian weights at DC and Nyquist are checked too.
    Fails if ``_SpectralConvolution.backward`` is made once differentiable or detaches its gradients."""
    fft_size = fast_fft_size(2 * n)
    x, spectrum = randn(2, n, CHANNELS), randn(CHANNELS, fft_size // 2 + 1, dtype=torch.complex128)
    assert gradgradcheck(spectral_matvec, (x, spectrum, fft_size), fast_mode=True)


@pytest.mark.parametrize("n", LENGTHS)
def test_factored_spectral_matvec_is_twice_differentiable(n):
    """Fails if ``_FactoredSpectralConvolution.backward`` is made once differentiable or detaches its gradients."""
    fft_size = fast_fft_size(2 * n)
    x, basis, readout = randn(2, n, CHANNELS), randn(4, fft_size // 2 + 1, dtype=torch.complex128), randn(4, CHANNELS)
    assert gradgradcheck(factored_spectral_matvec, (x, basis, readout, fft_size), fast_mode=True)


@pytest.mark.parametrize(("min_lag", "dilation"), [(0, 1), (-1, 1), (-2, 3)])
@pytest.mark.parametrize("n", LENGTHS)
def test_band_matvec_is_twice_differentiable(n, min_lag, dilation):
    """Fails if ``_BandConvolution.backward`` detaches its gradients (e.g. computes them under no_grad)."""
    x, taps = randn(2, n, CHANNELS), randn(CHANNELS, 3)
    assert gradgradcheck(functools.partial(band_matvec, min_lag=min_lag, dilation=dilation), (x, taps), fast_mode=True)


@pytest.mark.parametrize("path", ["linear", "sparse cubic", "dense"])
@pytest.mark.parametrize("n", LENGTHS)
def test_ski_low_rank_products_are_twice_differentiable(n, path):
    """W A W^T x on each path (``_AdjointPair`` for W and W^T, the Toeplitz Function for A).
    Fails if ``_AdjointPair.backward`` or the Toeplitz backward detaches its gradients."""
    rank = min(4, n)
    x, kernel = randn(2, n, CHANNELS), randn(2 * rank - 1, CHANNELS)
    assert gradgradcheck(ski_low_rank(path, n, rank), (x, kernel), fast_mode=True)


def ski_low_rank(path: str, n: int, rank: int):
    """(x, kernel) -> W A W^T x on ``path``."""
    if path == "linear":
        return ski_linear_matvec
    if path == "sparse cubic":
        return lambda x, kernel: ski_sparse_matvec(x, *ski_weights(n, rank, 3), kernel)
    return lambda x, kernel: ski_dense_matvec(x, dense_interpolation(n, rank, 1), kernel)


# --- ops: Hessians against the dense operators --------------------------------------------------

LOSSES = {  # scalar losses of an op's output y
    "tanh": lambda y: y.tanh().sum(),
    "cube": lambda y: y.pow(3).sum(),
    # linear in y: the gradient reaching the op does not require grad; the Hessian is the op's own cross term
    "linear": lambda y: (y * torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view_as(y)).sum(),
}


def toeplitz_case(causal: bool, n: int = 6):
    """(fast, dense, inputs): T x with the kernel as the second input."""
    inputs = (randn(2, n, CHANNELS, requires_grad=False), randn(kernel_rows(n, causal), CHANNELS, requires_grad=False))
    return functools.partial(toeplitz_matvec, causal=causal), functools.partial(naive_toeplitz_matvec, causal=causal), inputs


def factored_case(causal: bool, n: int = 6, columns: int = 2):
    """T x with the kernel (lags, e) @ readout (e, d): the factored Function of TNO, causal SKI-TNO and FD-TNO."""
    fft_size = fast_fft_size(2 * n)
    shapes = [(2, n, CHANNELS), (kernel_rows(n, causal), columns), (columns, CHANNELS)]
    inputs = tuple(randn(*shape, requires_grad=False) for shape in shapes)

    def fast(x, basis_kernel, readout):
        return factored_spectral_matvec(x, toeplitz_spectrum(basis_kernel, n, causal, fft_size), readout, fft_size)

    def dense(x, basis_kernel, readout):
        return naive_toeplitz_matvec(x, basis_kernel @ readout, causal)

    return fast, dense, inputs


def band_case(min_lag: int, n: int = 7):
    inputs = (randn(2, n, CHANNELS, requires_grad=False), randn(CHANNELS, 3, requires_grad=False))
    return functools.partial(band_matvec, min_lag=min_lag), functools.partial(naive_band_matvec, min_lag=min_lag), inputs


def ski_case(path: str, n: int = 9, rank: int = 4):
    degree = 3 if path == "sparse cubic" else 1
    inputs = (randn(2, n, CHANNELS, requires_grad=False), randn(2 * rank - 1, CHANNELS, requires_grad=False))
    interpolation = dense_interpolation(n, rank, degree).to(torch.float64)

    def dense(x, kernel):
        return torch.einsum("dij,bjd->bid", naive_ski_matrix(interpolation, toeplitz_blocks(kernel)), x)

    return ski_low_rank(path, n, rank), dense, inputs


OP_CASES = {
    "toeplitz": functools.partial(toeplitz_case, False),
    "toeplitz causal": functools.partial(toeplitz_case, True),
    "factored": functools.partial(factored_case, False),
    "factored causal": functools.partial(factored_case, True),
    "band centred": functools.partial(band_case, -1),
    "band causal": functools.partial(band_case, 0),
    "ski linear": functools.partial(ski_case, "linear"),
    "ski sparse cubic": functools.partial(ski_case, "sparse cubic"),
    "ski dense": functools.partial(ski_case, "dense"),
}


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("case", OP_CASES)
def test_hessian_vector_products_of_ops_equal_the_dense_operators(case, loss):
    """hvp (a direction that does not require grad) w.r.t. x and every kernel input, against the op's dense reference.
    Fails if any custom Function's backward is made once differentiable or detaches its gradients (zeros)."""
    fast, dense, inputs = OP_CASES[case]()
    direction = tuple(torch.randn_like(t) for t in inputs)
    _, fast_product = hvp(lambda *args: LOSSES[loss](fast(*args)), inputs, direction)
    _, dense_product = hvp(lambda *args: LOSSES[loss](dense(*args)), inputs, direction)
    for got, expected in zip(fast_product, dense_product, strict=True):
        assert expected.abs().max() > 0  # every block is a real check
        assert relative_error(got, expected) < 1e-10


@pytest.mark.parametrize("loss", ["tanh", "cube"])
@pytest.mark.parametrize("causal", [False, True])
def test_toeplitz_hessian_equals_the_dense_operators(causal, loss):
    """The whole Hessian of a non-quadratic loss w.r.t. (x, kernel), every block against the dense operator's.
    Fails if ``_SpectralConvolution.backward`` is made once differentiable or detaches its gradients."""
    fast, dense, inputs = toeplitz_case(causal, n=5)
    fast_hessian = hessian(lambda *args: LOSSES[loss](fast(*args)), inputs)
    dense_hessian = hessian(lambda *args: LOSSES[loss](dense(*args)), inputs)
    for fast_row, dense_row in zip(fast_hessian, dense_hessian, strict=True):
        for got, expected in zip(fast_row, dense_row, strict=True):
            assert relative_error(got, expected) < 1e-10


# --- mixers ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize(("name", "causal"), TOEPLITZ_MIXERS)
def test_toeplitz_mixers_are_twice_differentiable(name, causal, n):
    """gradgradcheck through the input and every parameter.
    Fails if either Toeplitz Function's backward (or ski_tno's band / interpolation backward) detaches its gradients."""
    function, parameters = with_parameters(mixer(name, causal, dim=2).double())
    assert gradgradcheck(function, (randn(1, n, 2), *parameters), fast_mode=True)


def finite_difference_hvp(loss, inputs: tuple, direction: tuple, step: float = 1e-6) -> tuple:
    """(grad loss(p + h v) - grad loss(p - h v)) / 2h, each gradient by first-order autograd only."""

    def gradient(shift: float):
        point = tuple((t + shift * v).detach().requires_grad_() for t, v in zip(inputs, direction, strict=True))
        return torch.autograd.grad(loss(*point), point, materialize_grads=True)

    return tuple((a - b) / (2 * step) for a, b in zip(gradient(step), gradient(-step), strict=True))


@pytest.mark.parametrize(("name", "causal"), MODES)
def test_mixer_hessian_vector_product_matches_finite_differences(name, causal):
    """hvp of sum(tanh(mixer(x))) w.r.t. the input and every parameter, in a random direction that does not
    require grad, equals central differences of the first-order gradient. Every registered mixer is
    twice differentiable, so a refusal (raise) fails here as a wrong value does.
    Fails if any mixer's second derivative is wrong, e.g. with ``@once_differentiable`` put back on the
    Toeplitz Functions (tno, fd_tno, ski_tno, ema and separable2d then return zeros for their terms)."""
    function, parameters = with_parameters(mixer(name, causal, dim=2).double())
    inputs = tuple(t.detach() for t in (randn(1, 7, 2), *parameters))
    direction = tuple(torch.randn_like(t) for t in inputs)

    def loss(*args):
        return function(*args).tanh().sum()

    _, product = hvp(loss, inputs, direction)
    expected = torch.cat([t.flatten() for t in finite_difference_hvp(loss, inputs, direction)])
    assert expected.abs().max() > 0
    assert relative_error(torch.cat([t.flatten() for t in product]), expected) < 1e-6


@pytest.mark.parametrize("name", ["tno", "fd_tno", "ski_tno"])
def test_outside_double_backward_a_second_derivative_is_refused_not_zero(name):
    """First-order training keeps no copy of x for a second derivative; asking for one raises. Fails if
    the Functions compute a detached (zero) second derivative instead, or keep x when not asked to."""
    from tokenmix.train.memory import saved_tensor_bytes

    layer = mixer(name, True, dim=CHANNELS).double()
    x = torch.randn(2, 7, CHANNELS, dtype=torch.float64)
    parameters = list(layer.parameters())
    with pytest.raises(tokenmix.ops.toeplitz.DoubleBackwardRefused, match="tokenmix.double_backward"):
        torch.autograd.grad(layer(x).tanh().sum(), parameters, create_graph=True)
    with pytest.raises(tokenmix.ops.toeplitz.DoubleBackwardRefused):
        hvp(lambda x: layer(x).tanh().sum(), x.requires_grad_(), torch.ones_like(x))
    exclude = {p.untyped_storage().data_ptr() for p in parameters}
    first_order = saved_tensor_bytes(lambda: layer(x).sum(), exclude)
    with tokenmix.double_backward():
        assert saved_tensor_bytes(lambda: layer(x).sum(), exclude) > first_order  # x kept only when asked


def test_outside_double_backward_attention_refuses_a_second_derivative():
    """Attention runs a fused kernel, which has no second derivative: outside ``double_backward()`` asking
    for one raises; inside, the reference kernel gives it (the hvp tests above). Fails if the fused
    kernel is also used inside the block, or if some path returns a detached (zero) second derivative."""
    layer = mixer("attention", False, dim=4)
    x = torch.randn(2, 7, 4, requires_grad=True)
    with pytest.raises(RuntimeError, match="derivative"):
        hvp(lambda x: layer(x).tanh().sum(), x, torch.ones_like(x))
