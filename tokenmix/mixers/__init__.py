"""Token mixers: (batch, length, dim) -> same shape; one file per family, a name registry."""

from . import attention, ema, fd_tno, fnet, relative_attention, ski_tno, ssm, tcn, tno, tno2d  # noqa: F401  (register the mixers)
from .attention import Attention, ChunkedAttention, RelativePosition
from .base import Mixer, check_sequence, zero_padding
from .ema import Ema
from .fd_tno import FdTno
from .fnet import Fnet, FnetAr
from .registry import build_mixer, list_mixers, register_mixer
from .relative_attention import RelativeAttention
from .rpe import PiecewiseLinearEncoder, RelativePositionEncoder
from .ski_tno import SkiTno
from .ssm import Ssm
from .tcn import Tcn, dilation_for, receptive_field
from .tno import Tno
from .tno2d import Separable2d, Tno2d

__all__ = [
    "Attention",
    "ChunkedAttention",
    "Ema",
    "FdTno",
    "Fnet",
    "FnetAr",
    "Mixer",
    "PiecewiseLinearEncoder",
    "RelativeAttention",
    "RelativePosition",
    "RelativePositionEncoder",
    "Separable2d",
    "SkiTno",
    "Ssm",
    "Tcn",
    "Tno",
    "Tno2d",
    "build_mixer",
    "check_sequence",
    "dilation_for",
    "list_mixers",
    "receptive_field",
    "register_mixer",
    "zero_padding",
]
