"""Model configs, the model registry and save/load."""

from .config import TASKS, ModelConfig
from .model import SegmentState, SequenceModel, build_model
from .pretrained import from_pretrained, save_pretrained
from .registry import list_models

__all__ = ["TASKS", "ModelConfig", "SegmentState", "SequenceModel", "build_model", "from_pretrained", "list_models", "save_pretrained"]
