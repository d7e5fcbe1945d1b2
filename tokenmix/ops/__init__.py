"""Pure tensor functions without parameters; every fast op has a naive_* reference beside it."""

from .activations import ACTIVATIONS, get_activation
from .fft import fast_fft_size, hermitian_weights, spectral_dtype
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
    "circulant_layout",
    "fast_fft_size",
    "fnet_mixing",
    "fourier_ar_matrix",
    "fourier_ar_mix",
    "get_activation",
    "hermitian_weights",
    "naive_fourier_ar_mix",
    "naive_toeplitz_matrix",
    "naive_toeplitz_matvec",
    "spectral_dtype",
    "spectral_matvec",
    "toeplitz_matvec",
    "toeplitz_spectrum",
]
