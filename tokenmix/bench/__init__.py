"""Speed and memory measurement of mixers, layers and models."""

from .cases import Case
from .measure import MEASUREMENT_FIELDS, Measurement, fft_floor_ms, measure
from .timing import median_ms

__all__ = ["MEASUREMENT_FIELDS", "Case", "Measurement", "fft_floor_ms", "measure", "median_ms"]
