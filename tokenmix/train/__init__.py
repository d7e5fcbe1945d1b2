"""Training, evaluation, checkpoints and generation."""

from .checkpoint import load_checkpoint, save_checkpoint
from .evaluate import evaluate_lm, evaluate_mlm
from .generate import generate
from .loop import TrainConfig, Trainer

__all__ = ["TrainConfig", "Trainer", "evaluate_lm", "evaluate_mlm", "generate", "load_checkpoint", "save_checkpoint"]
