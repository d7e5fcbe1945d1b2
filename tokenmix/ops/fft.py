"""FFT helpers shared by every spectral mixer.

All transforms run in float32 (complex64) whatever the input dtype; callers cast back.
"""

from __future__ import annotations

import torch

_FAST_RADICES = (2, 3, 5)


def _is_fast(size: int) -> bool:
    for radix in _FAST_RADICES:
        while size % radix == 0:
            size //= radix
    return size == 1


def fast_fft_size(minimum: int) -> int:
    """Smallest even 5-smooth integer >= ``minimum`` (a size pocketfft/cuFFT handle fastest)."""
    if minimum < 1:
        raise ValueError(f"minimum must be >= 1, got {minimum}")
    size = max(2, minimum + (minimum % 2))
    while not _is_fast(size):
        size += 2
    return size


def spectral_dtype(dtype: torch.dtype) -> torch.dtype:
    """Real dtype the FFTs run in: float64 stays float64, everything else is float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def hermitian_weights(fft_size: int, dtype=torch.float32, device=None) -> torch.Tensor:
    """c_m of a onesided spectrum: 1 at DC and Nyquist, 2 elsewhere (irfft counts the interior twice)."""
    weights = torch.full((fft_size // 2 + 1,), 2.0, dtype=dtype, device=device)
    weights[0] = 1.0
    weights[-1] = 1.0 if fft_size % 2 == 0 else 2.0
    return weights
