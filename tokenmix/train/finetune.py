"""Fine-tuning: a run that starts from a pretrained masked-LM's weights (``TrainConfig.init``).

``tokenmix finetune RUN --data glue-sst2:DIR`` trains the model of ``RUN`` (its name, sizes,
options and tokenizer) on a classification task with a new head: every weight but the head is
loaded from ``RUN``, as BERT / RoBERTa fine-tuning does (Devlin et al., "BERT", arXiv 1810.04805,
Section 3.2; the TNN paper's GLUE runs: Qin et al., "Toeplitz Neural Network for Sequence
Modeling", arXiv 2305.04749, Section 4). ``RUN`` is a run directory, its ``checkpoint.pt``, or a
``save_pretrained`` directory; it must be bidirectional (task "mlm").
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from ..data.tokenizer import TOKENIZER_FILE
from ..models.config import ModelConfig
from ..models.pretrained import CONFIG_FILE, WEIGHTS_FILE
from .checkpoint import load_checkpoint

HEAD_PREFIX = "classifier."
# Settings that come from the pretrained model (a fine-tuning run cannot change them).
FROM_PRETRAINED = ("model", "dim", "depth", "tokenizer", "task", "init")


def _is_pretrained_directory(path: Path) -> bool:
    return path.is_dir() and (path / CONFIG_FILE).is_file() and (path / WEIGHTS_FILE).is_file()


def read_pretrained(path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """(config, weights) of a run directory, checkpoint file or save_pretrained directory."""
    path = Path(path)
    if _is_pretrained_directory(path):
        return ModelConfig.from_dict(json.loads((path / CONFIG_FILE).read_text())), load_file(str(path / WEIGHTS_FILE))
    state = load_checkpoint(path)
    return ModelConfig.from_dict(state["model_config"]), state["model"]


def pretrained_vocab_size(path) -> int:
    return read_pretrained(path)[0].vocab_size


def tokenizer_file(path) -> str:
    """The ``--tokenizer`` of a fine-tuning run: the pretrained run's ``tokenizer.json``, or bytes
    for runs written before tokenizers (which were byte level)."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    file = folder / TOKENIZER_FILE
    return str(file) if file.is_file() else "bytes"


def finetune_settings(path, given: dict) -> dict:
    """TrainConfig settings of a fine-tuning run of ``path``: its model and tokenizer, task
    'classify', and ``given`` (the flags) for the rest. ValueError for a model it cannot fine-tune."""
    config, _ = read_pretrained(path)
    if config.task != "mlm":
        raise ValueError(
            f"fine-tuning starts from a bidirectional model pretrained with --task mlm; {str(path)!r} has task {config.task!r}"
        )
    fixed = sorted(key for key in FROM_PRETRAINED if key in given)
    if fixed:
        raise ValueError(f"{', '.join('--' + key for key in fixed)}: a fine-tuning run takes these from the pretrained model {str(path)!r}")
    options = {key: value for key, value in config.options.items() if key != "dropout"}  # --dropout applies
    base = {"model": config.name, "dim": config.dim, "depth": config.depth, "task": "classify", "tokenizer": tokenizer_file(path)}
    return {**base, "init": str(path), **given, "options": {**options, **given.get("options", {})}}


def load_initial_weights(model, path) -> None:
    """Copy every weight of the pretrained model at ``path`` into ``model`` except the task head
    (new, left as initialised); ValueError if the two models differ anywhere else."""
    config, weights = read_pretrained(path)
    own = model.state_dict()
    if config.vocab_size < model.config.vocab_size:
        raise ValueError(f"init {str(path)!r} has {config.vocab_size} token ids; the data needs {model.config.vocab_size}")
    missing = sorted(key for key in own if key not in weights and not key.startswith(HEAD_PREFIX))
    unexpected = sorted(key for key in weights if key not in own)
    wrong = sorted(key for key in weights if key in own and weights[key].shape != own[key].shape)
    if missing or unexpected or wrong:
        raise ValueError(
            f"init {str(path)!r} is not this model ({model.config.name}, dim {model.config.dim}, depth {model.config.depth}): "
            f"missing {missing[:5]}, unexpected {unexpected[:5]}, different shapes {wrong[:5]}"
        )
    model.load_state_dict({**own, **weights})
