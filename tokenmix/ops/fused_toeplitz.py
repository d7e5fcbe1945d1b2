"""The factored Toeplitz spectral product as one Triton kernel, and the switch between it and PyTorch's.

TNO, FD-TNO and causal SKI-TNO multiply the spectrum X = rfft(x, N) (batch, d, F) by a (d, F) complex
spectrum that is linear in a few basis spectra (TNN, Qin et al., arXiv 2305.04749, §3):

    K[c, f] = sum_e R[e, c] S[e, f]        R (e, d) real, S (e, F) complex, e ~ 33-65, d up to 1536+

PyTorch's path (``ops/toeplitz.py``) writes K to memory, then reads it back for X * K and, in the backward,
for G * conj(K) beside a separate pass for T = sum_b conj(G) X (G = rfft(dL/dy)). On a GPU those passes over
(d, F) and (batch, d, F) buffers, not the FFTs, bound the step. Here one kernel does each product in one
pass, the idea FlashFFTConv (Fu et al., arXiv 2311.05908) applies around the FFT itself: a program takes a
tile of (channels, frequencies), builds K's tile in registers from R's and S's tiles (e outer products),
and then streams every batch row of the tile through it:

    forward:   out[b] = X[b] * K
    backward:  out[b] = G[b] * conj(K)  and  T = sum_b conj(G[b]) X[b]  in the same pass over G and X

K is never formed; T is written once (the basis and readout gradients are two small matmuls with it,
``_FactoredSpectralConvolution``). Complex tensors are read as interleaved (real, imaginary) pairs
(``torch.view_as_real``); the arithmetic runs in X's real dtype (float32, or float64). The FFTs stay
``torch.fft``.

Triton is imported on first use (``pip install 'tokenmix[fused]'``). The mixers use the kernel on CUDA
tensors when triton imports, eagerly and inside ``torch.compile`` (as custom operators, kept whole in its
graph); ``kernels("torch")`` forces PyTorch's path (the reference and the fallback) for comparisons.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import importlib.util
import os
from itertools import takewhile

import torch

KERNELS = ("auto", "torch", "fused")
FUSED_EXTRA = "the fused kernels need Triton: pip install 'tokenmix[fused]'"
_BLOCK_CHANNELS, _BLOCK_FREQUENCIES = 16, 64  # a tile of K: 1024 complex values in registers (not tuned on a GPU yet)
FP_FUSION = True  # multiply-adds in one rounding; asked for explicitly (Triton 3.9 warns where the default is left to it)
_choice = ["auto"]


@contextlib.contextmanager
def kernels(choice: str):
    """Inside the block the factored Toeplitz products run on ``choice``: "auto" (the fused kernel on CUDA tensors when
    triton imports, else PyTorch's), "torch" (always PyTorch's) or "fused" (always the kernel; an error where it cannot
    run). Process-wide, as ``tokenmix bench --kernels`` sets it."""
    if choice not in KERNELS:
        raise ValueError(f"kernels must be one of {list(KERNELS)}, got {choice!r}")
    _choice.append(choice)
    try:
        yield
    finally:
        _choice.pop()


def kernel_choice() -> str:
    """The choice of the innermost ``kernels()`` block ("auto" outside any)."""
    return _choice[-1]


# Found once, at import: blocks ask inside compiled code, where torch 2.11's compiler cannot trace find_spec.
TRITON_INSTALLED = importlib.util.find_spec("triton") is not None


def triton_available() -> bool:
    """Whether triton can be imported (without importing it)."""
    return TRITON_INSTALLED


def interpreted() -> bool:
    """Whether Triton runs its kernels in its interpreter (TRITON_INTERPRET=1: on CPU tensors, slowly; for tests)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def _release(package: str) -> tuple[int, int]:
    """An installed package's (major, minor) version."""
    major, minor = (importlib.metadata.version(package).split(".") + ["0"])[:2]
    return int(major), int("".join(takewhile(str.isdigit, minor)) or 0)


def interpreter_fault() -> str | None:
    """Why Triton's interpreter cannot run the kernels with the installed packages, or None: before Triton 3.7 it turns
    one-element arrays into Python integers, which NumPy 2.4 refuses (triton-lang/triton issue 9171), so every loop whose
    bound is a kernel argument fails. Compiled kernels on a GPU are not affected. None too where triton's package goes
    by another name (pytorch-triton and the like: no known fault)."""
    try:
        triton, numpy = _release("triton"), _release("numpy")
    except importlib.metadata.PackageNotFoundError:
        return None
    if triton < (3, 7) and numpy >= (2, 4):
        return (
            f"Triton {'.'.join(map(str, triton))}'s interpreter fails with NumPy {'.'.join(map(str, numpy))} (triton-lang/triton "
            "issue 9171): pip install 'triton>=3.7' or 'numpy<2.4'"
        )
    return None


INTERPRETER_FAULT = interpreter_fault() if TRITON_INSTALLED else None  # found once, as TRITON_INSTALLED


def check_fused_device(device) -> None:
    """ValueError unless the kernel can run on ``device`` (a torch.device or its name): triton imports, and it is a CUDA
    device (any device under TRITON_INTERPRET=1, with an interpreter that works: ``interpreter_fault``)."""
    if not triton_available():
        raise ValueError(FUSED_EXTRA)
    if torch.device(device).type != "cuda":
        if not interpreted():
            raise ValueError(f"the fused kernels run on CUDA tensors (or any under TRITON_INTERPRET=1), got {device}")
        if INTERPRETER_FAULT:
            raise ValueError(f"the fused kernels cannot run on {device}: {INTERPRETER_FAULT}")


def import_triton():
    """(triton, triton.language), imported now; an ImportError that names the extra where triton is missing."""
    try:
        import triton
        import triton.language as tl
    except ImportError as error:
        raise ImportError(FUSED_EXTRA) from error
    return triton, tl


@functools.cache
def _kernel():
    """The Triton kernel, defined (and triton imported) on first use."""
    triton, tl = import_triton()

    @triton.jit
    def factored_product(
        a_ptr, x_ptr, out_ptr, sum_ptr, basis_ptr, readout_ptr,
        batch, channels, frequencies, rank, batch_stride, channel_stride, basis_stride, readout_row_stride, readout_column_stride,
        CONJUGATE: tl.constexpr, PRODUCT: tl.constexpr, SUM: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_F: tl.constexpr,
    ):  # fmt: skip
        """out[b] = A[b] * K (conj(K) when CONJUGATE) if PRODUCT; sum = sum_b conj(A[b]) X[b] if SUM; on one tile."""
        c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
        f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
        part = tl.arange(0, 2)  # real, imaginary
        c_mask, f_mask = c < channels, f < frequencies
        mask = (c_mask[:, None] & f_mask[None, :])[:, :, None] & (part[None, None, :] < 2)
        offsets = c.to(tl.int64)[:, None, None] * channel_stride + (2 * f)[None, :, None] + part[None, None, :]
        if PRODUCT:
            k_re = tl.zeros((BLOCK_C, BLOCK_F), dtype=out_ptr.dtype.element_ty)
            k_im = tl.zeros((BLOCK_C, BLOCK_F), dtype=out_ptr.dtype.element_ty)
            for e in range(rank):
                r = tl.load(readout_ptr + e * readout_row_stride + c * readout_column_stride, mask=c_mask, other=0.0)
                s_re = tl.load(basis_ptr + e * basis_stride + 2 * f, mask=f_mask, other=0.0)
                s_im = tl.load(basis_ptr + e * basis_stride + 2 * f + 1, mask=f_mask, other=0.0)
                k_re += r[:, None] * s_re[None, :]
                k_im += r[:, None] * s_im[None, :]
            if CONJUGATE:
                k_im = -k_im
        if SUM:
            t_re = tl.zeros((BLOCK_C, BLOCK_F), dtype=sum_ptr.dtype.element_ty)
            t_im = tl.zeros((BLOCK_C, BLOCK_F), dtype=sum_ptr.dtype.element_ty)
        for _ in range(batch):  # the pointers advance by a row (64-bit pointer arithmetic: no overflow)
            a_re, a_im = tl.split(tl.load(a_ptr + offsets, mask=mask, other=0.0))
            if SUM:
                x_re, x_im = tl.split(tl.load(x_ptr + offsets, mask=mask, other=0.0))
                t_re += a_re * x_re + a_im * x_im
                t_im += a_re * x_im - a_im * x_re
                x_ptr += batch_stride
            if PRODUCT:
                tl.store(out_ptr + offsets, tl.join(a_re * k_re - a_im * k_im, a_re * k_im + a_im * k_re), mask=mask)
                out_ptr += batch_stride
            a_ptr += batch_stride
        if SUM:
            tl.store(sum_ptr + offsets, tl.join(t_re, t_im), mask=mask)

    return triton, factored_product


def _launch(a, basis, readout, *, conjugate=False, product=None, x=None) -> torch.Tensor | None:
    """Run the kernel over a (batch, d, F) complex: writes A * K (conj(K)) into ``product`` when given, and returns
    sum_b conj(A[b]) X[b] when x is given."""
    triton, kernel = _kernel()
    batch, channels, frequencies = a.shape
    basis = basis.resolve_conj().to(a.dtype).contiguous()
    readout = readout.to(a.real.dtype)
    total = a.new_empty(channels, frequencies) if x is not None else None
    a_view = torch.view_as_real(a)

    def real(t):  # an unused pointer is any valid one
        return a_view if t is None else torch.view_as_real(t)

    block_c = min(_BLOCK_CHANNELS, triton.next_power_of_2(channels))
    block_f = min(_BLOCK_FREQUENCIES, triton.next_power_of_2(frequencies))
    grid = (triton.cdiv(channels, block_c), triton.cdiv(frequencies, block_f))
    with torch.cuda.device(a.device) if a.is_cuda else contextlib.nullcontext():  # Triton launches on the current device
        kernel[grid](
            a_view, real(x), real(product), real(total), real(basis), readout,
            batch, channels, frequencies, readout.shape[0], a_view.stride(0), a_view.stride(1), real(basis).stride(0),
            readout.stride(0), readout.stride(1),
            CONJUGATE=conjugate, PRODUCT=product is not None, SUM=x is not None, BLOCK_C=block_c, BLOCK_F=block_f,
            enable_fp_fusion=FP_FUSION,
        )  # fmt: skip
    return total


def _contiguous_spectrum(name: str, spectrum: torch.Tensor) -> torch.Tensor:
    if spectrum.dim() != 3 or not spectrum.is_complex():
        raise ValueError(f"{name} must be a complex (batch, channels, frequencies) spectrum, got {spectrum.dtype} {tuple(spectrum.shape)}")
    return spectrum.resolve_conj().contiguous()


# Inside ``torch.compile`` the launches are custom operators, which it keeps whole in its graph (``fullgraph`` included):
# compiled blocks run the kernels too, Inductor fusing the real-valued work around them (it generates no code for complex
# tensors). They are functional (a new output); eagerly the kernels write over their input where it is not needed again.
@torch.library.custom_op("tokenmix::fused_factored_multiply", mutates_args=())
def _product_op(spectrum: torch.Tensor, basis: torch.Tensor, readout: torch.Tensor, conjugate: bool) -> torch.Tensor:
    product = torch.empty_like(spectrum)
    _launch(spectrum, basis, readout, conjugate=conjugate, product=product)
    return product


@_product_op.register_fake
def _(spectrum, basis, readout, conjugate):
    return torch.empty_like(spectrum)


@torch.library.custom_op("tokenmix::fused_factored_backward", mutates_args=())
def _product_and_sum_op(
    grad: torch.Tensor, spectrum: torch.Tensor, basis: torch.Tensor, readout: torch.Tensor, want_product: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    product = torch.empty_like(grad) if want_product else None
    total = _launch(grad, basis, readout, conjugate=True, product=product, x=spectrum)
    return grad.new_empty(0) if product is None else product, total


@_product_and_sum_op.register_fake
def _(grad, spectrum, basis, readout, want_product):
    return torch.empty_like(grad) if want_product else grad.new_empty(0), grad.new_empty(grad.shape[1:])


def fused_factored_multiply(spectrum: torch.Tensor, basis: torch.Tensor, readout: torch.Tensor, in_place: bool = False) -> torch.Tensor:
    """X * K for X (batch, d, F) complex and K = readout^T basis (basis (e, F) complex, readout (e, d) real), K not
    formed; written over X when ``in_place`` (X contiguous) outside ``torch.compile``."""
    check_fused_device(spectrum.device)
    spectrum = _contiguous_spectrum("spectrum", spectrum)
    if torch.compiler.is_compiling() or not in_place:
        return _product_op(spectrum, basis, readout, False)
    _launch(spectrum, basis, readout, product=spectrum)
    return spectrum


def fused_factored_backward(
    grad: torch.Tensor, spectrum: torch.Tensor, basis: torch.Tensor, readout: torch.Tensor, want_product: bool, want_sum: bool
):
    """(G * conj(K), written over G outside ``torch.compile``, and T = sum_b conj(G) X) in one pass over G (batch, d, F)
    and X; None for each not wanted."""
    check_fused_device(grad.device)
    grad = _contiguous_spectrum("grad", grad)
    x = _contiguous_spectrum("spectrum", spectrum).to(grad.dtype) if want_sum else None
    if torch.compiler.is_compiling():
        if want_sum:
            product, total = _product_and_sum_op(grad, x, basis, readout, want_product)
            return product if want_product else None, total
        return _product_op(grad, basis, readout, True) if want_product else None, None
    if not (want_product or want_sum):
        return None, None
    total = _launch(grad, basis, readout, conjugate=True, product=grad if want_product else None, x=x)
    return grad if want_product else None, total


class FusedFactoredProduct:
    """The spectral product of ``_FactoredSpectralConvolution`` (``ops/toeplitz.py``) by the kernel; K is never formed,
    so nothing but the factors is kept for the backward."""

    @staticmethod
    def forward(spectrum, basis, readout, in_place):
        return fused_factored_multiply(spectrum, basis, readout, in_place), None

    @staticmethod
    def backward(grad, x_freq, basis, readout, saved, want_product, want_sum):
        return fused_factored_backward(grad, x_freq, basis, readout, want_product, want_sum)
