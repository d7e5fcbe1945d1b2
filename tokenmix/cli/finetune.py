"""``tokenmix finetune``: a pretrained masked-LM run fine-tuned on a classification task, or a causal language
model (a distilled one: ``tokenmix distil``) trained on from its weights."""

from __future__ import annotations

from dataclasses import asdict

from ..errors import user_input
from ..fields import Existing
from ..runs import open_run
from ..train.config import TrainConfig
from ..train.finetune import FROM_PRETRAINED, finetune_data, finetune_settings
from .train import (
    add_run_flags,
    finished_is_done,
    given_settings,
    make_trainer,
    resolve_auto_resume,
    run_training,
    train_config_from_args,
)

# A fine-tuning run's defaults where they differ from training's (BERT's recipe, Devlin et al.
# arXiv 1810.04805 Appendix A.3, scaled to CPU budgets: a short linear schedule, small weight decay).
FINETUNE_DEFAULTS = {
    "lr": 3e-4,
    "steps": 500,
    "schedule": "linear",
    "min_lr_ratio": 0.0,
    "weight_decay": 0.01,
    "batch_size": 32,
    "eval_every": 100,
    "dropout": 0.1,
    "out": "runs/finetune",
}


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "finetune",
        help="fine-tune a pretrained masked-LM run on a classification task (GLUE: --data glue-sst2:DIR), or a causal LM "
        "(a distilled one) on text",
    )
    parser.add_argument(
        "pretrained",
        type=Existing("a pretrained run"),
        help="a run directory (or checkpoint.pt, or save_pretrained directory) trained with --task mlm, or a causal LM",
    )
    data = (
        "a masked LM: the classification task to fine-tune on (needed unless --resume); a causal LM: text (default: its own). "
        "Tasks: glue-TASK:DIR (cola, sst2, mrpc, qqp, stsb, mnli, qnli, "
        "rte), listops[:DIR], lra-text:DIR, lra-retrieval:DIR, lra-image:DIR, lra-pathfinder:DIR, shapes (docs/language.md, docs/lra.md)"
    )
    defaults = {**asdict(TrainConfig()), **FINETUNE_DEFAULTS, "data": None}
    add_run_flags(parser, defaults, skipped=(*FROM_PRETRAINED, "recipe"), helps={"data": data})
    parser.set_defaults(handler=run_finetune, sample_tokens=0)


def run_finetune(args) -> int:
    with user_input():
        auto, pretrained, trainer = resolve_auto_resume(args, FINETUNE_DEFAULTS["out"]), None, None
        if args.resume:
            args.out = args.out or FINETUNE_DEFAULTS["out"]
            config = train_config_from_args(args)
            if config.init is None:
                raise ValueError(f"--resume: the run in {args.out!r} is not a fine-tuning run; continue it with `tokenmix train --resume`")
        else:
            pretrained = open_run(args.pretrained)
            args.data = finetune_data(pretrained, args.pretrained, args.data)
            # a --minutes budget sets steps to None over the default step count
            defaults = {**FINETUNE_DEFAULTS, **_causal_defaults(pretrained)}
            config = TrainConfig(**finetune_settings(pretrained, args.pretrained, {**defaults, **given_settings(args)}))
        with finished_is_done(auto):
            trainer = make_trainer(config, args, pretrained)
    return run_training(trainer, "finetune", sample_tokens=0) if trainer else 0


def _causal_defaults(pretrained) -> dict:
    """A causal LM goes on with its own dropout (the classifier recipe's 0.1 would change the model it recovers), sequence
    length and batch size, where its checkpoint has them."""
    if pretrained.config.task != "lm":
        return {}
    settings = pretrained.settings or {}
    kept = {key: settings[key] for key in ("seq_len", "batch_size") if key in settings}
    return {"dropout": pretrained.config.options.get("dropout", 0.0), **kept}
