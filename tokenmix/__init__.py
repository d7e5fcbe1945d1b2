"""tokenmix: fast token mixers for long sequences (TNN, SKI/FD-TNN, FNetAR, TCNCA)."""

from .mixers import build_mixer, list_mixers
from .models import ModelConfig, build_model, from_pretrained, list_models
from .runtime import retain_freed_memory

__version__ = "0.1.0"

__all__ = ["ModelConfig", "build_mixer", "build_model", "from_pretrained", "list_mixers", "list_models", "retain_freed_memory"]
