"""Residual blocks built around the token mixers."""

from .glu import Glu, Gtu
from .tnn import TnnBlock
from .xl import RelativeAttention, XlBlock, fnet_ar_xl_layers, xl_layers

__all__ = ["Glu", "Gtu", "RelativeAttention", "TnnBlock", "XlBlock", "fnet_ar_xl_layers", "xl_layers"]
