"""Model configs, the model registry, the sequence model and save_pretrained (``tokenmix.runs`` reads it back)."""

from .config import FORMAT_VERSION, ModelConfig
from .model import SequenceModel, build_model
from .registry import TASKS, list_models, resolve_model, resolve_model_options
from .saving import save_pretrained

__all__ = [
    "FORMAT_VERSION",
    "TASKS",
    "resolve_model",
    "resolve_model_options",
    "ModelConfig",
    "SequenceModel",
    "build_model",
    "list_models",
    "save_pretrained",
]
