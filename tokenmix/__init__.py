"""tokenmix: fast token mixers for long sequences (TNN, SKI/FD-TNN, FNetAR, TCNCA).

The public names below are imported on first use: ``import tokenmix`` loads no model, data or
training code until one of them is asked for.
"""

from __future__ import annotations

from .lazy import lazy_exports
from .version import __version__

_EXPORTS = {
    "ModelConfig": ".models",
    "Tokenizer": ".data.tokenizer",
    "build_mixer": ".mixers",
    "build_model": ".models",
    "check_finite_inputs": ".validation",
    "double_backward": ".ops.second_order",
    "generate": ".generation",
    "list_mixers": ".mixers",
    "list_models": ".models",
    "open_run": ".runs",
    "retain_freed_memory": ".runtime",
    "train_bpe": ".data.tokenizer",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = [
    "__version__",
    "ModelConfig",
    "Tokenizer",
    "build_mixer",
    "build_model",
    "check_finite_inputs",
    "double_backward",
    "generate",
    "list_mixers",
    "list_models",
    "open_run",
    "retain_freed_memory",
    "train_bpe",
]
