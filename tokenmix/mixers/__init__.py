"""Token mixers: (batch, length, dim) -> same shape; one file per family, a name registry."""

from . import fd_tno, fnet, ski_tno, tno  # noqa: F401  (register the mixers)
from .base import Mixer, check_sequence, zero_padding
from .fd_tno import FdTno
from .fnet import Fnet, FnetAr
from .registry import build_mixer, list_mixers, register_mixer
from .rpe import PiecewiseLinearEncoder, RelativePositionEncoder
from .ski_tno import SkiTno
from .tno import Tno

__all__ = [
    "FdTno",
    "Fnet",
    "FnetAr",
    "Mixer",
    "PiecewiseLinearEncoder",
    "RelativePositionEncoder",
    "SkiTno",
    "Tno",
    "build_mixer",
    "check_sequence",
    "list_mixers",
    "register_mixer",
    "zero_padding",
]
