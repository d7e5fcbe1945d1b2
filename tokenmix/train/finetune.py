"""Fine-tuning: a run that starts from a pretrained model's weights (``TrainConfig.init``).

``tokenmix finetune RUN --data glue-sst2:DIR`` trains the model of ``RUN`` (its name, sizes,
options and tokenizer) on a classification task with a new head: every weight but the head is
loaded from ``RUN``, as BERT / RoBERTa fine-tuning does (Devlin et al., "BERT", arXiv 1810.04805,
Section 3.2; the TNN paper's GLUE runs: Qin et al., "Toeplitz Neural Network for Sequence
Modeling", arXiv 2305.04749, Section 4). ``RUN`` is whatever ``tokenmix.open_run`` opens: a run directory,
its ``checkpoint.pt``, or a ``save_pretrained`` directory. A bidirectional model (task "mlm") is fine-tuned as a classifier; a
causal language model (task "lm") goes on as one, on the data it was trained on unless told: a
distilled model (``tokenmix distil``) recovers there what the distillation cost. The fine-tuned run
reads its data with the pretrained model's tokenizer (kept in its checkpoint).
"""

from __future__ import annotations

from ..runs import Run
from ..runs.weights import load_weights

HEAD_PREFIX = "classifier."
# Settings that come from the pretrained model (a fine-tuning run cannot change them).
FROM_PRETRAINED = ("model", "dim", "depth", "tokenizer", "task", "init")
FINETUNED_TASK = {"mlm": "classify", "lm": "lm"}  # the pretrained model's task -> the fine-tuning run's
TEXT = "fine-tuning reads text with the pretrained model's tokenizer"


def finetuned_task(pretrained: Run, path) -> str:
    """The task a fine-tuning run of ``pretrained`` (read from ``path``) trains: ValueError for a model it cannot start from."""
    pretrained.text_tokenizer(TEXT)
    task = pretrained.config.task
    if task not in FINETUNED_TASK:
        raise ValueError(
            f"fine-tuning starts from a masked LM (task mlm: a classifier follows) or a causal language model (task lm: it "
            f"goes on as one); {str(path)!r} has task {task!r}"
        )
    return FINETUNED_TASK[task]


def check_init_task(pretrained: Run, path, task: str) -> None:
    """ValueError unless a run of ``task`` may start from ``pretrained``'s weights (read from ``path``): its own task
    (more of the same training) or the one it is fine-tuned to (``FINETUNED_TASK``)."""
    pretrained.text_tokenizer(TEXT)
    allowed = list(dict.fromkeys([pretrained.config.task, FINETUNED_TASK.get(pretrained.config.task, pretrained.config.task)]))
    if task not in allowed:
        raise ValueError(
            f"init: a model pretrained with task {pretrained.config.task!r} ({str(path)!r}) starts runs of task "
            f"{' or '.join(map(repr, allowed))}, not {task!r}"
        )


def finetune_data(pretrained: Run, path, data: str | None) -> str:
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
    data = data or (pretrained.settings or {}).get("data")
    if data is None:
        raise ValueError(
            f"finetune needs --data for the causal language model {str(path)!r}: its text (the model does not say what it was trained on)"
        )
    if task not in objective_class(data).tasks:
        raise ValueError(f"--data {data!r}: a causal language model is fine-tuned on text (a .txt file, wikitext:DIR, shakespeare, ...)")
    return data


def finetune_settings(pretrained: Run, path, given: dict) -> dict:
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


def load_initial_weights(model, pretrained: Run, path) -> None:
    """Copy every weight of ``pretrained`` (read from ``path``) into ``model`` except the task head
    (new, left as initialised); ValueError if the two models differ anywhere else."""
    head = {key: value for key, value in model.state_dict().items() if key.startswith(HEAD_PREFIX)}
    body = {key: value for key, value in pretrained.model.state_dict().items() if not key.startswith(HEAD_PREFIX)}
    load_weights(model, {**body, **head}, f"init {str(path)!r}")
