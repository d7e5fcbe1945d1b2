"""Fine-tuning: a run that starts from a pretrained masked-LM's weights (``TrainConfig.init``).

``tokenmix finetune RUN --data glue-sst2:DIR`` trains the model of ``RUN`` (its name, sizes,
options and tokenizer) on a classification task with a new head: every weight but the head is
loaded from ``RUN``, as BERT / RoBERTa fine-tuning does (Devlin et al., "BERT", arXiv 1810.04805,
Section 3.2; the TNN paper's GLUE runs: Qin et al., "Toeplitz Neural Network for Sequence
Modeling", arXiv 2305.04749, Section 4). ``RUN`` is a run directory, its ``checkpoint.pt``, or a
``save_pretrained`` directory; it must be bidirectional (task "mlm"). The fine-tuned run reads
its data with the pretrained model's tokenizer (kept in its checkpoint).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from ..data.corpus import BYTE_VOCAB
from ..data.tokenizer import TOKENIZER_FILE, Tokenizer, byte_tokenizer
from ..models.config import ModelConfig
from ..models.pretrained import CONFIG_FILE, WEIGHTS_FILE
from .checkpoint import checkpoint_tokenizer, load_checkpoint

HEAD_PREFIX = "classifier."
# Settings that come from the pretrained model (a fine-tuning run cannot change them).
FROM_PRETRAINED = ("model", "dim", "depth", "tokenizer", "task", "init")


@dataclass
class Pretrained:
    """A pretrained model's config, weights and tokenizer."""

    config: ModelConfig
    weights: dict[str, torch.Tensor]
    tokenizer: Tokenizer


def read_pretrained(path) -> Pretrained:
    """The model at ``path``: a run directory or checkpoint file (its tokenizer is kept in the
    checkpoint), or a save_pretrained directory (its ``tokenizer.json``; none: a byte-level model)."""
    path = Path(path)
    if path.is_dir() and (path / CONFIG_FILE).is_file() and (path / WEIGHTS_FILE).is_file():
        config = ModelConfig.from_dict(json.loads((path / CONFIG_FILE).read_text()))
        if (path / TOKENIZER_FILE).is_file():
            tokenizer = Tokenizer.load(path)
        elif config.vocab_size in (BYTE_VOCAB, BYTE_VOCAB + 1):
            tokenizer = byte_tokenizer()
        else:
            raise ValueError(f"{str(path)!r} has no {TOKENIZER_FILE} for its {config.vocab_size} token ids: put the tokenizer beside it")
        return Pretrained(config, load_file(str(path / WEIGHTS_FILE)), tokenizer)
    state = load_checkpoint(path)
    tokenizer = checkpoint_tokenizer(state)
    if tokenizer is None:
        raise ValueError(f"{str(path)!r} was trained on {state['train_config']['data']!r}, which is not text: nothing to fine-tune on text")
    return Pretrained(ModelConfig.from_dict(state["model_config"]), state["model"], tokenizer)


def finetune_settings(pretrained: Pretrained, path, given: dict) -> dict:
    """TrainConfig settings of a fine-tuning run of the model ``pretrained`` read from ``path``: its
    model, task 'classify', and ``given`` (the flags) for the rest. ValueError for a model it cannot
    fine-tune or a flag that would change the pretrained model."""
    config = pretrained.config
    if config.task != "mlm":
        raise ValueError(
            f"fine-tuning starts from a bidirectional model pretrained with --task mlm; {str(path)!r} has task {config.task!r}"
        )
    fixed = sorted(key for key in FROM_PRETRAINED if key in given)
    if fixed:
        raise ValueError(f"{', '.join('--' + key for key in fixed)}: a fine-tuning run takes these from the pretrained model {str(path)!r}")
    options = {key: value for key, value in config.options.items() if key != "dropout"}  # --dropout applies
    base = {"model": config.name, "dim": config.dim, "depth": config.depth, "task": "classify", "tokenizer": pretrained.tokenizer.name}
    return {**base, "init": str(path), **given, "options": {**options, **given.get("options", {})}}


def load_initial_weights(model, pretrained: Pretrained, path) -> None:
    """Copy every weight of ``pretrained`` (read from ``path``) into ``model`` except the task head
    (new, left as initialised); ValueError if the two models differ anywhere else."""
    own, weights = model.state_dict(), pretrained.weights
    missing = sorted(key for key in own if key not in weights and not key.startswith(HEAD_PREFIX))
    unexpected = sorted(key for key in weights if key not in own)
    wrong = sorted(key for key in weights if key in own and weights[key].shape != own[key].shape)
    if missing or unexpected or wrong:
        raise ValueError(
            f"init {str(path)!r} is not this model ({model.config.name}, dim {model.config.dim}, depth {model.config.depth}): "
            f"missing {missing[:5]}, unexpected {unexpected[:5]}, different shapes {wrong[:5]}"
        )
    model.load_state_dict({**own, **weights})
