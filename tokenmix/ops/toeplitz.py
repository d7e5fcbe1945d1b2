"""Toeplitz matrix-vector products (TNN, Qin et al. 2023, §3.2 and Appendix B).

A Toeplitz matrix T_ij = t_{i-j} of size n x n acts on a sequence by a linear convolution.
Embedding it in a circulant matrix of size N >= 2n gives y = irfft(rfft(x, N) * rfft(k, N))[:n]
with the kernel laid out as [t_0, t_1, ..., t_{n-1}, 0, ..., 0, t_{-(n-1)}, ..., t_{-1}].
Causal operators keep only lags >= 0.

Spectra are held channels first, (d, N/2 + 1): the FFTs then run along contiguous memory (the
zero padding to N already copies x, so the transpose is free), and a spectrum produced by a real
matmul lands in the interleaved complex layout directly.

Kernels are given by lag, rows ordered from the most negative lag:
- shape (2n - 1, d): lags -(n-1) ... n-1 (bidirectional, or causal with the negatives ignored);
- shape (n, d): lags 0 ... n-1 (causal only).
"""

from __future__ import annotations

import warnings

import torch

from ..precision import without_autocast
from .fft import convolution_fft_size, hermitian_weights, spectral_dtype
from .forms import OpForms, register_op, without_state
from .fused_toeplitz import FusedFactoredProduct, check_fused_device, kernel_choice, triton_available
from .history_toeplitz import history_product
from .layout import channels_first
from .second_order import double_backward_enabled


def _check_kernel(kernel: torch.Tensor, n: int, causal: bool) -> None:
    if kernel.dim() != 2:
        raise ValueError(f"kernel must be 2-D (lags, channels), got shape {tuple(kernel.shape)}")
    accepted = (n, 2 * n - 1) if causal else (2 * n - 1,)
    if kernel.shape[0] not in accepted:
        raise ValueError(
            f"kernel for length n={n} ({'causal' if causal else 'bidirectional'}) must have "
            f"{' or '.join(map(str, accepted))} lag rows, got {kernel.shape[0]}"
        )


def circulant_layout(kernel: torch.Tensor, n: int, fft_size: int, causal: bool) -> torch.Tensor:
    """Lay a by-lag kernel (see module doc) out as the first column of an N x N circulant."""
    _check_kernel(kernel, n, causal)
    nonnegative = kernel[-n:]
    pad = fft_size - n
    if causal or n == 1:
        return torch.nn.functional.pad(nonnegative, (0, 0, 0, pad))
    negative = kernel[: n - 1]
    zeros = kernel.new_zeros(pad - (n - 1), kernel.shape[1])
    return torch.cat([nonnegative, zeros, negative], dim=0)


def toeplitz_spectrum(kernel: torch.Tensor, n: int, causal: bool, fft_size: int | None = None) -> torch.Tensor:
    """rfft of the circulant embedding, channels first: (d, N/2 + 1) complex, float32 or float64."""
    fft_size = fft_size or convolution_fft_size(2 * n)
    layout = circulant_layout(kernel.to(spectral_dtype(kernel.dtype)), n, fft_size, causal)
    return torch.fft.rfft(layout.t(), dim=-1)


def _input_spectrum(x: torch.Tensor, fft_size: int) -> torch.Tensor:
    """rfft along the length of x (batch, n, d) at N points in the spectral dtype, channels first: (batch, d, N/2 + 1)."""
    return torch.fft.rfft(channels_first(x.to(spectral_dtype(x.dtype)), fft_size), dim=-1)


def _output_signal(product: torch.Tensor, fft_size: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """The first n samples of irfft(product, N) in ``dtype``, as a (batch, n, d) view of the channels-first result.
    Cast only where the dtype differs: torch 2.11's compiler routes a Function's gradient to the wrong output when the
    tensor it returns is also an intermediate (``.to`` to its own dtype returns it; pytorch issue 180642), and its
    gradients were then zeros."""
    signal = torch.fft.irfft(product, n=fft_size, dim=-1)[..., :n].transpose(1, 2)
    return signal if signal.dtype == dtype else signal.to(dtype)


def _convolve(ctx, x: torch.Tensor, multiply, fft_size: int, keep_input: bool):
    """Forward of both Functions: (y, rfft(x) when ``keep_input`` (for dL/dK; otherwise the product may overwrite it),
    what the product keeps) with ``multiply(X, in_place) -> (X * K, kept)`` and y = irfft(X * K)[:n] in x's dtype."""
    x_freq = _input_spectrum(x, fft_size)
    product, kept = multiply(x_freq, not keep_input)
    ctx.fft_size, ctx.input_dtype = fft_size, x.dtype
    return _output_signal(product, fft_size, x.shape[1], x.dtype), x_freq if keep_input else None, kept


def _multiply(x_freq: torch.Tensor, spectrum: torch.Tensor, in_place: bool) -> torch.Tensor:
    return x_freq.mul_(spectrum) if in_place else x_freq * spectrum


def _spectral_backward(grad_freq, x_freq, spectrum, want_x: bool, want_spectrum: bool):
    """(G * conj(K) written over G, T = sum_b conj(G) * X) for a formed spectrum K; None for each not wanted."""
    conj_grad_freq = torch.conj_physical_(grad_freq)
    products = _batch_sum_of_products(conj_grad_freq, x_freq) if want_spectrum else None
    return torch.conj_physical_(conj_grad_freq.mul_(spectrum)) if want_x else None, products


def _convolve_backward(ctx, grad_y, spectral_backward, want_x: bool, want_spectrum: bool):
    """(dL/dx, T) with T = sum_b conj(G) * X, G = rfft(dL/dy): dL/dK = (c / N) conj(T) in PyTorch's convention.
    ``spectral_backward(G, want_x, want_spectrum) -> (G * conj(K), T)`` (each None when not wanted); dL/dx =
    irfft(G * conj(K)), a correlation with the kernel."""
    fft_size, n = ctx.fft_size, grad_y.shape[1]
    grad_x_freq, products = spectral_backward(_input_spectrum(grad_y, fft_size), want_x, want_spectrum)
    grad_x = _output_signal(grad_x_freq, fft_size, n, ctx.input_dtype) if want_x else None
    return grad_x, products


def _differentiable_products(x: torch.Tensor, grad_y: torch.Tensor, fft_size: int) -> torch.Tensor:
    """T = sum_b conj(G) * X of ``_convolve_backward`` by plain rfft calls, which autograd differentiates again."""

    def spectrum_of(signal: torch.Tensor) -> torch.Tensor:
        return torch.fft.rfft(signal.to(spectral_dtype(signal.dtype)).transpose(1, 2), n=fft_size, dim=-1)

    return (spectrum_of(grad_y).conj() * spectrum_of(x)).sum(0)


class DoubleBackwardRefused(RuntimeError):
    """A second derivative through a Toeplitz kernel whose forward ran outside ``double_backward()``."""


def _backward_products(ctx, grad_y, x, spectral_backward, transposed_product):
    """(dL/dx, T) for both Functions; None for what autograd does not need.

    When autograd records the backward (create_graph=True, for second derivatives), both are built
    from differentiable operations: dL/dx = irfft(G * conj(K))[:n] is ``transposed_product(dL/dy)``,
    the same Function with the conjugate spectrum (the reversed kernel), and T comes from plain FFTs
    of the saved x and dL/dy, so the gradients stay connected to x, the kernel and dL/dy.
    """
    want_x, want_kernel = ctx.needs_input_grad[0], any(ctx.needs_input_grad[1:])
    if not torch.is_grad_enabled():
        return _convolve_backward(ctx, grad_y, spectral_backward, want_x, want_kernel)
    if want_kernel and x is None:
        raise DoubleBackwardRefused(
            "a second derivative through a Toeplitz kernel (create_graph=True, hvp, hessian) needs its forward run inside "
            "`with tokenmix.double_backward():`, which keeps the inputs it needs (off by default: it costs memory)"
        )
    grad_x = transposed_product(grad_y) if want_x else None
    return grad_x, _differentiable_products(x, grad_y, ctx.fft_size) if want_kernel else None


class _SpectralConvolution(torch.autograd.Function):
    """y = irfft(rfft(x, N) * K)[:n] along the length of x (batch, n, d); K is (d, N/2 + 1).

    Backward of exactly two FFTs: dL/dx = irfft(G * conj(K))[:n] (a correlation) and, in
    PyTorch's convention for a complex K, dL/dK = sum_batch (c / N) * G * conj(X), where
    G = rfft(dL/dy, N) and c are the onesided Hermitian weights (PyTorch's generic rfft backward
    would run a full complex FFT). Large temporaries are reused in place: on CPU a fresh buffer
    costs more than the arithmetic. Inputs of the FFTs are made channels first by ``channels_first``;
    the output is a (batch, n, d) view of a channels-first buffer. The FFTs run in the spectral
    dtype; y and dL/dx have x's.

    Twice (and further) differentiable: with create_graph=True the backward is built from this
    Function and plain FFTs (``_backward_products``). That needs x itself (the caller's tensor, before
    any cast) saved beside rfft(x), which a forward inside ``double_backward()`` does.
    """

    @staticmethod
    @without_autocast
    def forward(ctx, x: torch.Tensor, spectrum: torch.Tensor, fft_size: int) -> torch.Tensor:
        keep_input = ctx.needs_input_grad[1]
        y, x_freq, _ = _convolve(ctx, x, lambda x_freq, in_place: (_multiply(x_freq, spectrum, in_place), None), fft_size, keep_input)
        ctx.save_for_backward(x if keep_input and double_backward_enabled() else None, x_freq, spectrum)
        return y

    @staticmethod
    @without_autocast
    def backward(ctx, grad_y: torch.Tensor):
        x, x_freq, spectrum = ctx.saved_tensors
        grad_x, products = _backward_products(
            ctx,
            grad_y,
            x,
            lambda grad_freq, *wanted: _spectral_backward(grad_freq, x_freq, spectrum, *wanted),
            lambda g: _SpectralConvolution.apply(g, spectrum.conj_physical(), ctx.fft_size),
        )
        grad_spectrum = None
        if products is not None:  # in the spectrum's dtype even when x came in another
            weights = hermitian_weights(ctx.fft_size, products.real.dtype, grad_y.device).div_(ctx.fft_size)
            grad_spectrum = torch.conj_physical_(products).mul_(weights).to(spectrum.dtype)
        return grad_x, grad_spectrum, None


def _real_view(spectrum: torch.Tensor) -> torch.Tensor:
    """(rows, F) complex -> (rows, 2F) real, the interleaved real and imaginary parts (no copy)."""
    return torch.view_as_real(spectrum).flatten(-2)


class _FactoredSpectralConvolution(torch.autograd.Function):
    """y = irfft(rfft(x, N) * K)[:n] with K = R^T S: a (d, F) spectrum linear in e basis spectra.

    S (e, F) complex, R (e, d) real; in the real view K_v = R^T S_v, one matmul. With
    T = sum_b conj(G) X (see ``_convolve_backward``), dL/dK_v = T_v * c_v where c_v interleaves
    (c / N, -c / N) per frequency (the weights, and the conjugation as a sign), so
    dL/dR = (S_v * c_v) T_v^T and dL/dS_v = (R T_v) * c_v: the weights and the conjugation act on
    the small (e, 2F) side instead of costing two more passes over the (d, F) gradient.
    Twice differentiable as ``_SpectralConvolution``, dL/dx = irfft(G * R^T conj(S))[:n] being this
    Function with the conjugate basis.

    ``product`` computes X * K and (G * conj(K), T): ``MaterialisedProduct`` forms K (PyTorch's path),
    ``FusedFactoredProduct`` (``ops/fused_toeplitz.py``) never does; the FFTs and the factors' gradients are shared.
    """

    @staticmethod
    @without_autocast
    def forward(ctx, x: torch.Tensor, basis: torch.Tensor, readout: torch.Tensor, fft_size: int, product) -> torch.Tensor:
        keep_input = any(ctx.needs_input_grad[1:3])
        multiply = lambda x_freq, in_place: product.forward(x_freq, basis, readout, in_place)  # noqa: E731
        y, x_freq, spectrum = _convolve(ctx, x, multiply, fft_size, keep_input)  # spectrum: K where the product formed it
        ctx.product = product
        ctx.save_for_backward(x if keep_input and double_backward_enabled() else None, x_freq, spectrum, basis, readout)
        return y

    @staticmethod
    @without_autocast
    def backward(ctx, grad_y: torch.Tensor):
        x, x_freq, spectrum, basis, readout = ctx.saved_tensors
        product = ctx.product
        grad_x, products = _backward_products(
            ctx,
            grad_y,
            x,
            lambda grad_freq, *wanted: product.backward(grad_freq, x_freq, basis, readout, spectrum, *wanted),
            lambda g: _FactoredSpectralConvolution.apply(g, basis.conj_physical(), readout, ctx.fft_size, product),
        )
        want_basis, want_readout = ctx.needs_input_grad[1:3]
        grad_basis = grad_readout = None
        if products is not None:  # computed in the products' dtype (x's), returned in the parameters'
            products = _real_view(products)
            weights = hermitian_weights(ctx.fft_size, products.dtype, basis.device).div_(ctx.fft_size)
            signed = torch.stack([weights, -weights], dim=-1).flatten()
            if want_readout:
                grad_readout = ((_real_view(basis).to(products.dtype) * signed) @ products.t()).to(readout.dtype)
            if want_basis:
                grad_basis = (readout.to(products.dtype) @ products).mul_(signed).unflatten(-1, (-1, 2))
                grad_basis = torch.view_as_complex(grad_basis).to(basis.dtype)
        return grad_x, grad_basis, grad_readout, None, None


class MaterialisedProduct:
    """The spectral product of ``_FactoredSpectralConvolution`` with K = R^T S formed (one matmul, kept for the
    backward): PyTorch's path, the reference and the fallback of the fused kernel."""

    @staticmethod
    def forward(x_freq, basis, readout, in_place):
        spectrum = complex_readout(basis, readout)
        return _multiply(x_freq, spectrum, in_place), spectrum

    @staticmethod
    def backward(grad_freq, x_freq, basis, readout, spectrum, want_x, want_spectrum):
        return _spectral_backward(grad_freq, x_freq, spectrum, want_x, want_spectrum)


def _batch_sum_of_products(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """sum_b a[b] * b[b] without a (batch, ...) temporary (inside ``torch.compile``, whose graph would fix the batch
    size of a loop, with one)."""
    if torch.compiler.is_compiling():
        return (a * b).sum(0)
    total = a[0] * b[0]
    for index in range(1, a.shape[0]):
        total.addcmul_(a[index], b[index])
    return total


def spectral_matvec(x: torch.Tensor, spectrum: torch.Tensor, fft_size: int) -> torch.Tensor:
    """Apply a circulant-embedded operator given by its (d, N/2 + 1) spectrum to x (batch, n, d).

    Runs in float32 (float64 stays float64) and returns x's dtype.
    """
    return _SpectralConvolution.apply(x, spectrum, fft_size)


def factored_spectral_matvec(x: torch.Tensor, basis: torch.Tensor, readout: torch.Tensor, fft_size: int) -> torch.Tensor:
    """``spectral_matvec`` for the spectrum readout^T @ basis (basis (e, F) complex, readout (e, d) real)
    without differentiating through the (d, F) spectrum: the fused product of TNO, FD-TNO and causal
    SKI-TNO, whose kernels are linear in a few parameter columns."""
    return _FactoredSpectralConvolution.apply(x, basis, readout, fft_size, MaterialisedProduct)


def fused_factored_spectral_matvec(x: torch.Tensor, basis: torch.Tensor, readout: torch.Tensor, fft_size: int) -> torch.Tensor:
    """``factored_spectral_matvec`` with its spectral products in one Triton kernel each (``ops/fused_toeplitz.py``):
    the (d, F) spectrum is never formed. The same dtypes, gradients and second derivatives; CUDA tensors (any under
    TRITON_INTERPRET=1); needs ``pip install 'tokenmix[fused]'``."""
    check_fused_device(x.device)
    return _FactoredSpectralConvolution.apply(x, basis, readout, fft_size, FusedFactoredProduct)


def fused_wanted(x: torch.Tensor) -> bool:
    """Whether a factored product of x runs the fused kernel under the current ``kernels()`` choice ("auto": on a CUDA
    tensor where triton imports and the kernel proved itself there, ``fused_ready``)."""
    choice = kernel_choice()
    if choice == "torch":
        return False
    if choice == "fused":
        check_fused_device(x.device)
        return True
    return x.is_cuda and triton_available() and fused_ready(x.device)


_READY: dict[str, bool] = {}  # by device: whether the kernel ran there and agreed with PyTorch's path


def fused_ready(device) -> bool:
    """Whether the kernel runs on ``device`` and agrees with PyTorch's path, found on first asking by one small factored
    product, forward and backward, both ways; where it fails or disagrees, a warning, and PyTorch's path from then on.
    Inside ``torch.compile``, what an eager call found before (else no: ``probe_fused_kernels`` asks first)."""
    key = str(torch.device(device))
    if key not in _READY and not torch.compiler.is_compiling():
        _READY[key] = _agrees_with_torch(torch.device(device))
    return _READY.get(key, False)


def probe_fused_kernels(device) -> None:
    """``fused_ready`` asked now, eagerly, where "auto" may run the fused kernels (a CUDA device, triton installed): a
    module compiled next for ``device`` uses them only if this has been asked before. Under "torch" (or "fused") the
    kernels are not tried."""
    if kernel_choice() == "auto" and torch.device(device).type == "cuda" and triton_available():
        fused_ready(device)


def _agrees_with_torch(device: torch.device) -> bool:
    """Both fused kernels against PyTorch's path on one small problem each: the factored product (forward and
    gradients) and the static step's history product (``ops/history_toeplitz.py``)."""
    fallback = "PyTorch's path runs instead"
    try:
        with torch.inference_mode(False):  # first asked, maybe, by a decoding step under inference mode: the probe differentiates
            pairs = [*_factored_results(device), *_history_results(device)]
    except Exception as error:  # noqa: BLE001 - whatever stops a kernel that never ran here, PyTorch's path runs instead
        warnings.warn(f"the fused Toeplitz kernels failed on {device} ({type(error).__name__}: {error}); {fallback}", stacklevel=3)
        return False
    worst = max(float((got - expected).norm() / expected.norm()) for got, expected in pairs)
    if worst > 1e-4:
        warnings.warn(
            f"the fused Toeplitz kernels differ from PyTorch's path on {device} (relative error {worst:.3g}); {fallback}", stacklevel=3
        )
    return worst <= 1e-4


def _factored_results(device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(fused, PyTorch's) output and gradients of one factored product."""
    generator = torch.Generator().manual_seed(0)
    x, basis, readout = (torch.randn(shape, generator=generator) for shape in ((3, 100, 40), (5, 129, 2), (5, 40)))
    results = []
    for matvec in (fused_factored_spectral_matvec, factored_spectral_matvec):
        inputs = [tensor.to(device).requires_grad_() for tensor in (x, torch.view_as_complex(basis), readout)]
        with torch.enable_grad():
            y = matvec(*inputs, 256)
            results.append([y.detach(), *torch.autograd.grad(y.square().sum(), inputs)])
    return list(zip(*results, strict=True))


def _history_results(device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(fused, PyTorch's) output and written buffer of one history product, rows at different positions."""
    generator = torch.Generator().manual_seed(0)
    inputs, x, taps = (torch.randn(shape, generator=generator).to(device) for shape in ((2, 150, 40), (2, 40), (150, 40)))
    position = torch.tensor([149, 70], device=device)
    inputs[1, 70:] = 0  # the torch form reads past the position: zeros there, as in a stream's buffer
    buffers = [inputs.clone(), inputs.clone()]
    outputs = [history_product(buffer, position, x, taps, fused=fused) for buffer, fused in zip(buffers, (True, False), strict=True)]
    return [(outputs[0], outputs[1]), (buffers[0], buffers[1])]


def complex_readout(basis: torch.Tensor, readout: torch.Tensor) -> torch.Tensor:
    """K = readout^T @ basis as (d, F) complex: one real matmul on the basis's (e, 2F) real view, whose
    (d, 2F) result is already interleaved complex."""
    product = readout.t().to(basis.real.dtype) @ _real_view(basis)
    return torch.view_as_complex(product.unflatten(-1, (-1, 2)))


def toeplitz_matvec(x: torch.Tensor, kernel: torch.Tensor, causal: bool) -> torch.Tensor:
    """y_i = sum_j t_{i-j} x_j per channel, by FFT at a fast size N >= 2n.

    x: (batch, n, d); kernel: (2n - 1, d) by lag, or (n, d) lags 0..n-1 when causal.
    """
    if x.dim() != 3:
        raise ValueError(f"x must be (batch, length, channels), got shape {tuple(x.shape)}")
    n = x.shape[1]
    _check_kernel(kernel, n, causal)
    if kernel.shape[1] != x.shape[2]:
        raise ValueError(f"kernel has {kernel.shape[1]} channels but x has {x.shape[2]}")
    fft_size = convolution_fft_size(2 * n)
    return spectral_matvec(x, toeplitz_spectrum(kernel, n, causal, fft_size), fft_size)


def naive_toeplitz_matrix(kernel: torch.Tensor, n: int, causal: bool) -> torch.Tensor:
    """Explicit (d, n, n) matrices T_ij = t_{i-j} (zero above the diagonal when causal)."""
    _check_kernel(kernel, n, causal)
    full = kernel if kernel.shape[0] == 2 * n - 1 else torch.cat([kernel.new_zeros(n - 1, kernel.shape[1]), kernel])
    lags = torch.arange(n)[:, None] - torch.arange(n)[None, :]
    matrix = full[lags + n - 1].permute(2, 0, 1)
    if causal:
        matrix = matrix * (lags >= 0).to(matrix.dtype)
    return matrix


def naive_toeplitz_matvec(x: torch.Tensor, kernel: torch.Tensor, causal: bool) -> torch.Tensor:
    """Reference: build the explicit n x n matrix per channel and multiply (tests only)."""
    matrix = naive_toeplitz_matrix(kernel, x.shape[1], causal)
    return torch.einsum("dij,bjd->bid", matrix, x)


def _bidirectional_example(batch: int, n: int, dim: int, dtype: torch.dtype, generator: torch.Generator):
    lags = torch.arange(-(n - 1), n, dtype=dtype)[:, None]
    kernel = torch.randn(2 * n - 1, dim, dtype=dtype, generator=generator) * 0.9 ** lags.abs()
    return torch.randn(batch, n, dim, dtype=dtype, generator=generator), {"kernel": kernel}, None


register_op(
    "toeplitz",
    OpForms(
        without_state(lambda x, params: naive_toeplitz_matvec(x, params["kernel"], False)),
        without_state(lambda x, params: toeplitz_matvec(x, params["kernel"], False)),
        None,
        _bidirectional_example,
    ),
)


def _factored_matvec(matvec):
    """The form of the factored op by ``matvec`` (factored_spectral_matvec or its fused twin): the basis kernel's spectrum."""

    def run(x: torch.Tensor, params: dict) -> torch.Tensor:
        n = x.shape[1]
        fft_size = convolution_fft_size(2 * n)
        return matvec(x, toeplitz_spectrum(params["basis_kernel"], n, False, fft_size), params["readout"], fft_size)

    return without_state(run)


def _factored_example(batch: int, n: int, dim: int, dtype: torch.dtype, generator: torch.Generator, rank: int = 4):
    """x, and a kernel basis_kernel @ readout of ``rank`` decaying columns by lag (as TNO's features times its output layer)."""
    lags = torch.arange(-(n - 1), n, dtype=dtype)[:, None]
    basis_kernel = torch.randn(2 * n - 1, rank, dtype=dtype, generator=generator) * 0.9 ** lags.abs()
    readout = torch.randn(rank, dim, dtype=dtype, generator=generator)
    return torch.randn(batch, n, dim, dtype=dtype, generator=generator), {"basis_kernel": basis_kernel, "readout": readout}, None


register_op(  # the product of TNO, FD-TNO and causal SKI-TNO: a kernel linear in a few columns, applied by its factors
    "factored_toeplitz",
    OpForms(
        without_state(lambda x, params: naive_toeplitz_matvec(x, params["basis_kernel"] @ params["readout"], False)),
        _factored_matvec(factored_spectral_matvec),
        None,
        _factored_example,
        fused=_factored_matvec(fused_factored_spectral_matvec),
    ),
)
