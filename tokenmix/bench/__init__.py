"""Speed measurement of mixers (median of repeats after warm-up)."""

from .mixers import Measurement, fft_floor_ms, measure_mixer
from .timing import median_ms

__all__ = ["Measurement", "fft_floor_ms", "measure_mixer", "median_ms"]
