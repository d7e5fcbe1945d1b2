"""Residual blocks built around the token mixers."""

from .ffn import Ffn
from .glu import Glu, Gtu
from .mega import MegaBlock
from .prenorm import PreNormBlock, TcncaSimpleBlock, TransformerBlock
from .tnn import TnnBlock
from .xl import FourierXlStack, XlBlock

__all__ = [
    "Ffn",
    "FourierXlStack",
    "Glu",
    "Gtu",
    "MegaBlock",
    "PreNormBlock",
    "TcncaSimpleBlock",
    "TnnBlock",
    "TransformerBlock",
    "XlBlock",
]
