"""tokenmix: fast token mixers for long sequences (TNN, SKI/FD-TNN, FNetAR, TCNCA)."""

from .data.tokenizer import Tokenizer, train_bpe
from .mixers import build_mixer, list_mixers
from .models import ModelConfig, build_model, from_pretrained, list_models
from .ops.second_order import double_backward
from .runtime import retain_freed_memory
from .train.generate import generate
from .validation import check_finite_inputs
from .version import __version__

__all__ = [
    "__version__",
    "check_finite_inputs",
    "double_backward",
    "ModelConfig",
    "Tokenizer",
    "build_mixer",
    "build_model",
    "from_pretrained",
    "generate",
    "list_mixers",
    "list_models",
    "retain_freed_memory",
    "train_bpe",
]
