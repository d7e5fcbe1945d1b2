"""Speed and memory measurement of mixers, layers and models, and of decoding (``--kinds generate``)."""

from .cases import Case
from .measure import fft_floor_ms, measure
from .records import MEASUREMENT_FIELDS, Measurement
from .timing import median_ms

__all__ = ["MEASUREMENT_FIELDS", "Case", "Measurement", "fft_floor_ms", "measure", "median_ms"]
