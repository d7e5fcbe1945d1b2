"""Fine-tuning: a run that starts from a pretrained model's weights (``TrainConfig.init``).

``tokenmix finetune RUN --data glue-sst2:DIR`` trains the model of ``RUN`` (its name, sizes,
options and tokenizer) on a classification task with a new head: every weight but the head is
loaded from ``RUN``, as BERT / RoBERTa fine-tuning does (Devlin et al., "BERT", arXiv 1810.04805,
Section 3.2; the TNN paper's GLUE runs: Qin et al., "Toeplitz Neural Network for Sequence
Modeling", arXiv 2305.04749, Section 4). ``RUN`` is a run directory, its ``checkpoint.pt``, or a
``save_pretrained`` directory. A bidirectional model (task "mlm") is fine-tuned as a classifier; a
causal language model (task "lm") goes on as one, on the data it was trained on unless told: a
distilled model (``tokenmix distil``) recovers there what the distillation cost. The fine-tuned run
reads its data with the pretrained model's tokenizer (kept in its checkpoint).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..data.corpus import BYTE_VOCAB
from ..data.tokenizer import TOKENIZER_FILE, Tokenizer, byte_tokenizer
from ..models.config import ModelConfig
from ..models.pretrained import load_weights, read_saved
from ..models.saving import CONFIG_FILE, WEIGHTS_FILE
from .checkpoint import checked_model_of, checkpoint_tokenizer, load_checkpoint, resolve_checkpoint

HEAD_PREFIX = "classifier."
# Settings that come from the pretrained model (a fine-tuning run cannot change them).
FROM_PRETRAINED = ("model", "dim", "depth", "tokenizer", "task", "init")
FINETUNED_TASK = {"mlm": "classify", "lm": "lm"}  # the pretrained model's task -> the fine-tuning run's


@dataclass
class Pretrained:
    """A pretrained model's config, weights and tokenizer."""

    config: ModelConfig
    weights: dict[str, torch.Tensor]
    tokenizer: Tokenizer
    settings: dict = field(default_factory=dict)  # its training settings (data, seq_len, ...), where its checkpoint has them


def read_pretrained(path) -> Pretrained:
    """The model at ``path``: a run directory or checkpoint file (its tokenizer is kept in the
    checkpoint), or a save_pretrained directory (its ``tokenizer.json``; none: a byte-level model)."""
    path = Path(path)
    if path.is_dir() and ((path / CONFIG_FILE).is_file() or (path / WEIGHTS_FILE).is_file()):
        config, weights = read_saved(path)
        if (path / TOKENIZER_FILE).is_file():
            tokenizer = Tokenizer.load(path)
        elif config.vocab_size in (BYTE_VOCAB, BYTE_VOCAB + 1):
            tokenizer = byte_tokenizer()
        else:
            raise ValueError(f"{str(path)!r} has no {TOKENIZER_FILE} for its {config.vocab_size} token ids: put the tokenizer beside it")
        return Pretrained(config, weights, tokenizer)
    file = resolve_checkpoint(path)
    state = load_checkpoint(file)
    tokenizer = checkpoint_tokenizer(state, file)
    if tokenizer is None:
        data = state["train_config"].get("data")
        raise ValueError(f"{str(path)!r} was trained on {data!r}, which is not text: nothing to fine-tune on text")
    return Pretrained(*checked_model_of(state, file), tokenizer, dict(state["train_config"]))


def finetuned_task(pretrained: Pretrained, path) -> str:
    """The task a fine-tuning run of ``pretrained`` (read from ``path``) trains: ValueError for a model it cannot start from."""
    task = pretrained.config.task
    if task not in FINETUNED_TASK:
        raise ValueError(
            f"fine-tuning starts from a masked LM (task mlm: a classifier follows) or a causal language model (task lm: it "
            f"goes on as one); {str(path)!r} has task {task!r}"
        )
    return FINETUNED_TASK[task]


def check_init_task(pretrained: Pretrained, path, task: str) -> None:
    """ValueError unless a run of ``task`` may start from ``pretrained``'s weights (read from ``path``): its own task
    (more of the same training) or the one it is fine-tuned to (``FINETUNED_TASK``)."""
    allowed = list(dict.fromkeys([pretrained.config.task, FINETUNED_TASK.get(pretrained.config.task, pretrained.config.task)]))
    if task not in allowed:
        raise ValueError(
            f"init: a model pretrained with task {pretrained.config.task!r} ({str(path)!r}) starts runs of task "
            f"{' or '.join(map(repr, allowed))}, not {task!r}"
        )


def finetune_data(pretrained: Pretrained, path, data: str | None) -> str:
    """The data a fine-tuning run of ``pretrained`` reads: ``data`` if it suits the run's task, else for a causal
    language model the data it was trained on; ValueError otherwise."""
    from .objectives import objective_class

    task = finetuned_task(pretrained, path)
    if task == "classify":
        if data is None:
            raise ValueError("finetune needs --data: the classification task to fine-tune on, e.g. --data glue-sst2:DIR (docs/language.md)")
        if task not in objective_class(data).tasks:
            raise ValueError(
                f"--data {data!r} is not a classification task; finetune trains a classifier from a masked LM: give glue-TASK:DIR, "
                "listops, lra-text:DIR, lra-retrieval:DIR, lra-image:DIR, lra-pathfinder:DIR or shapes"
            )
        return data
    data = data or pretrained.settings.get("data")
    if data is None:
        raise ValueError(
            f"finetune needs --data for the causal language model {str(path)!r}: its text (the model does not say what it was trained on)"
        )
    if task not in objective_class(data).tasks:
        raise ValueError(f"--data {data!r}: a causal language model is fine-tuned on text (a .txt file, wikitext:DIR, shakespeare, ...)")
    return data


def finetune_settings(pretrained: Pretrained, path, given: dict) -> dict:
    """TrainConfig settings of a fine-tuning run of the model ``pretrained`` read from ``path``: its
    model, its fine-tuning task, and ``given`` (the flags) for the rest. ValueError for a model it cannot
    fine-tune or a flag that would change the pretrained model."""
    config = pretrained.config
    task = finetuned_task(pretrained, path)
    fixed = sorted(key for key in FROM_PRETRAINED if key in given)
    if fixed:
        raise ValueError(f"{', '.join('--' + key for key in fixed)}: a fine-tuning run takes these from the pretrained model {str(path)!r}")
    options = {key: value for key, value in config.options.as_dict().items() if key != "dropout"}  # --dropout applies
    base = {"model": config.name, "dim": config.dim, "depth": config.depth, "task": task, "tokenizer": pretrained.tokenizer.name}
    return {**base, "init": str(path), **given, "options": {**options, **given.get("options", {})}}


def load_initial_weights(model, pretrained: Pretrained, path) -> None:
    """Copy every weight of ``pretrained`` (read from ``path``) into ``model`` except the task head
    (new, left as initialised); ValueError if the two models differ anywhere else."""
    head = {key: value for key, value in model.state_dict().items() if key.startswith(HEAD_PREFIX)}
    body = {key: value for key, value in pretrained.weights.items() if not key.startswith(HEAD_PREFIX)}
    load_weights(model, {**body, **head}, f"init {str(path)!r}")
