"""Training, evaluation, and writing and resuming runs (``tokenmix.runs`` reads them)."""

from .config import TrainConfig
from .evaluate import evaluate_lm, evaluate_mlm
from .loop import Trainer

__all__ = ["TrainConfig", "Trainer", "evaluate_lm", "evaluate_mlm"]
