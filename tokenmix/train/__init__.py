"""Training, evaluation and checkpoints."""

from .checkpoint import load_checkpoint, save_checkpoint
from .config import TrainConfig
from .evaluate import evaluate_lm, evaluate_mlm
from .loop import Trainer

__all__ = ["TrainConfig", "Trainer", "evaluate_lm", "evaluate_mlm", "load_checkpoint", "save_checkpoint"]
