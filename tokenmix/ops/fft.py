"""FFT helpers shared by every spectral mixer.

All transforms run in float32 (complex64) whatever the input dtype; callers cast back.
"""

from __future__ import annotations

import torch

_LARGEST_FAST_SIZE = 1 << 40


def _even_fast_sizes(limit: int) -> tuple[int, ...]:
    """Every even 5-smooth integer up to ``limit``, ascending (2^a 3^b 5^c with a >= 1)."""
    sizes, power_of_five = [], 1
    while power_of_five <= limit:
        power_of_three = power_of_five
        while power_of_three <= limit:
            size = 2 * power_of_three
            while size <= limit:
                sizes.append(size)
                size *= 2
            power_of_three *= 3
        power_of_five *= 5
    return tuple(sorted(sizes))


_FAST_SIZES = _even_fast_sizes(_LARGEST_FAST_SIZE)


def fast_fft_size(minimum: int) -> int:
    """Smallest even 5-smooth integer >= ``minimum`` (a size pocketfft/cuFFT handle fastest).

    A binary search of the sizes by comparisons alone: with a symbolic length inside ``torch.compile`` the
    guards it leaves are a range of lengths (those sharing the size), not its remainders modulo 2, 3 and 5.
    """
    if minimum < 1:
        raise ValueError(f"minimum must be >= 1, got {minimum}")
    if minimum > _LARGEST_FAST_SIZE:
        raise ValueError(f"minimum must be <= {_LARGEST_FAST_SIZE}, got {minimum}")
    low, high = 0, len(_FAST_SIZES) - 1
    while low < high:  # the first size >= minimum lies in [low, high]
        middle = (low + high) // 2
        if _FAST_SIZES[middle] < minimum:
            low = middle + 1
        else:
            high = middle
    return _FAST_SIZES[low]


def convolution_fft_size(minimum: int) -> int:
    """An FFT size >= ``minimum`` for an exact linear convolution by a circulant embedding (any such size gives
    the same product): ``fast_fft_size`` eagerly; inside ``torch.compile``, the smallest power of two, found by
    comparisons alone, so that the guards a symbolic length leaves hold for every length up to that size and
    one compiled graph serves them all (5-smooth sizes lie closer together: a graph per few lengths)."""
    if not torch.compiler.is_compiling():
        return fast_fft_size(minimum)
    size = 2
    while size < minimum:
        size *= 2
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
