"""Pure tensor functions without parameters; every op registers its naive, parallel and recurrent forms (``forms.py``)."""

from . import attention, dilated, ema, fourier, hilbert, online_toeplitz, ski, toeplitz, toeplitz2d  # noqa: F401  (register the op forms)
from .activations import ACTIVATIONS, get_activation
from .fft import fast_fft_size, hermitian_weights, spectral_dtype
from .forms import OpForms, list_ops, op_forms
from .fourier import fnet_mixing, fourier_ar_matrix, fourier_ar_mix, naive_fourier_ar_mix
from .toeplitz import (
    circulant_layout,
    naive_toeplitz_matrix,
    naive_toeplitz_matvec,
    spectral_matvec,
    toeplitz_matvec,
    toeplitz_spectrum,
)

__all__ = [
    "ACTIVATIONS",
    "OpForms",
    "circulant_layout",
    "fast_fft_size",
    "fnet_mixing",
    "fourier_ar_matrix",
    "fourier_ar_mix",
    "get_activation",
    "hermitian_weights",
    "list_ops",
    "naive_fourier_ar_mix",
    "naive_toeplitz_matrix",
    "naive_toeplitz_matvec",
    "op_forms",
    "spectral_dtype",
    "spectral_matvec",
    "toeplitz_matvec",
    "toeplitz_spectrum",
]
