"""``tokenmix finetune``: a pretrained masked-LM run fine-tuned on a classification task."""

from __future__ import annotations

from dataclasses import asdict

from ..errors import user_input
from ..fields import Existing
from ..train.config import TrainConfig
from ..train.finetune import FROM_PRETRAINED, finetune_settings, read_pretrained
from ..train.objectives import objective_class
from .train import add_run_flags, given_settings, make_trainer, run_training, train_config_from_args

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
        "finetune", help="fine-tune a pretrained masked-LM run on a classification task (GLUE: --data glue-sst2:DIR)"
    )
    parser.add_argument(
        "pretrained",
        type=Existing("a pretrained run"),
        help="a run directory (or checkpoint.pt, or save_pretrained directory) trained with --task mlm",
    )
    data = (
        "the classification task to fine-tune on (needed unless --resume): glue-TASK:DIR (cola, sst2, mrpc, qqp, stsb, mnli, qnli, "
        "rte), listops[:DIR], lra-text:DIR, lra-retrieval:DIR, lra-image:DIR, lra-pathfinder:DIR, shapes (docs/language.md, docs/lra.md)"
    )
    defaults = {**asdict(TrainConfig()), **FINETUNE_DEFAULTS, "data": None}
    add_run_flags(parser, defaults, skipped=(*FROM_PRETRAINED, "recipe"), helps={"data": data})
    parser.set_defaults(handler=run_finetune, sample_tokens=0)


def run_finetune(args) -> int:
    with user_input():
        pretrained = None
        if args.resume:
            args.out = args.out or FINETUNE_DEFAULTS["out"]
            config = train_config_from_args(args)
            if config.init is None:
                raise ValueError(f"--resume: the run in {args.out!r} is not a fine-tuning run; continue it with `tokenmix train --resume`")
        else:
            if args.data is None:
                raise ValueError(
                    "finetune needs --data: the classification task to fine-tune on, e.g. --data glue-sst2:DIR (docs/language.md)"
                )
            if "classify" not in objective_class(args.data).tasks:
                raise ValueError(
                    f"--data {args.data!r} is not a classification task; finetune trains a classifier: give glue-TASK:DIR, listops, "
                    "lra-text:DIR, lra-retrieval:DIR, lra-image:DIR, lra-pathfinder:DIR or shapes"
                )
            # a --minutes budget sets steps to None over the default step count
            pretrained = read_pretrained(args.pretrained)
            config = TrainConfig(**finetune_settings(pretrained, args.pretrained, {**FINETUNE_DEFAULTS, **given_settings(args)}))
        trainer = make_trainer(config, args, pretrained)
    return run_training(trainer, "finetune", sample_tokens=0)
