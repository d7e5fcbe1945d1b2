"""Pure tensor functions without parameters; every fast op has a naive_* reference beside it."""

from .fft import fast_fft_size, hermitian_weights, spectral_dtype
from .toeplitz import (
    circulant_layout,
    naive_toeplitz_matrix,
    naive_toeplitz_matvec,
    spectral_matvec,
    toeplitz_matvec,
    toeplitz_spectrum,
)

__all__ = [
    "circulant_layout",
    "fast_fft_size",
    "hermitian_weights",
    "naive_toeplitz_matrix",
    "naive_toeplitz_matvec",
    "spectral_dtype",
    "spectral_matvec",
    "toeplitz_matvec",
    "toeplitz_spectrum",
]

from .activations import ACTIVATIONS, get_activation  # noqa: E402

__all__ += ["ACTIVATIONS", "get_activation"]
