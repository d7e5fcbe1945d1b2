"""Residual blocks built around the token mixers."""

from .glu import Glu, Gtu
from .tnn import TnnBlock

__all__ = ["Glu", "Gtu", "TnnBlock"]
