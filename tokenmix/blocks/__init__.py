"""Residual blocks built around the token mixers."""

from .ffn import Ffn
from .glu import Glu, Gtu
from .mega import MegaBlock
from .prenorm import PreNormBlock, tcnca_simple_block, transformer_block
from .tnn import TnnBlock
from .xl import RelativeAttention, XlBlock, fnet_ar_xl_layers, xl_layers

__all__ = [
    "Ffn",
    "Glu",
    "Gtu",
    "MegaBlock",
    "PreNormBlock",
    "RelativeAttention",
    "TnnBlock",
    "XlBlock",
    "fnet_ar_xl_layers",
    "tcnca_simple_block",
    "transformer_block",
    "xl_layers",
]
