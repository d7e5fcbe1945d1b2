"""Token mixers: (batch, length, dim) -> same shape; one file per family, a name registry."""

from . import fnet, tno  # noqa: F401  (register the mixers)
from .base import Mixer, check_sequence, zero_padding
from .fnet import Fnet, FnetAr
from .registry import build_mixer, list_mixers, register_mixer
from .rpe import RelativePositionEncoder
from .tno import Tno

__all__ = [
    "Fnet",
    "FnetAr",
    "Mixer",
    "RelativePositionEncoder",
    "Tno",
    "build_mixer",
    "check_sequence",
    "list_mixers",
    "register_mixer",
    "zero_padding",
]
