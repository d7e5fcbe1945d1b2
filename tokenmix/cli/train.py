"""``tokenmix train``: a run from flags, a recipe, or its checkpoint (``--resume``)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from dataclasses import asdict, fields
from pathlib import Path

from ..errors import user_input
from ..fields import Choice, Integer
from ..generation import generate
from ..ops.fused_toeplitz import kernels
from ..runs.checkpoint import load_checkpoint, resolve_checkpoint
from ..runs.layout import CHECKPOINT_FILE
from ..train.config import TrainConfig
from ..train.directory import STARTED_FILES, existing_run_files
from ..train.evaluate import describe
from ..train.loop import Trainer
from ..train.recipes import apply_recipe
from ..train.resume import train_config_of
from ..train.stopping import RunFinished, TrainingDiverged, TrainingInterrupted
from .common import DEMO_PROMPT, INTERRUPTED_STATUS, OPTION, printable

AUTO = "auto"


def add_run_flags(parser, defaults: dict, skipped: tuple[str, ...] = (), helps: dict | None = None) -> None:
    """A flag per TrainConfig field (but ``skipped``) with its kind, help (``helps`` override some) and the
    default a help line shows (``defaults``), -o options, --resume / --overwrite."""
    for spec in fields(TrainConfig):
        if spec.name == "options" or spec.name in skipped:
            continue
        flag = f"--{spec.name.replace('_', '-')}"
        kind, help_text = spec.metadata["kind"], (helps or {}).get(spec.name, spec.metadata["help"])
        if kind is None:  # a switch
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_text)
            continue
        default = defaults[spec.name]
        shown = "" if default is None else f" (default: {default})"
        parser.add_argument(flag, type=kind, default=None, help=help_text + kind.listing() + shown)
    parser.add_argument(
        "-o",
        "--option",
        type=OPTION,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a model or mixer option, e.g. -o decay=1.0 -o rpe_layers=1 (docs/options.md lists every model's and mixer's options)",
    )
    run = parser.add_mutually_exclusive_group()
    run.add_argument(
        "--resume",
        nargs="?",
        const=True,
        default=False,
        type=Choice([AUTO]),
        metavar="auto",
        help="continue the run in --out from its checkpoint (its settings are kept); --resume auto: if there is one, else start "
        "the run (for torchrun --max-restarts: docs/scale.md)",
    )
    run.add_argument("--overwrite", action="store_true", help="replace a run already in --out (by default such a directory is refused)")
    parser.add_argument(
        "--allow-data-change",
        action="store_true",
        help="with --resume: continue although data files differ from those the checkpoint recorded (size, SHA-256)",
    )
    parser.add_argument(
        "--no-memory-check",
        action="store_true",
        help="start even when the estimated memory of a training step exceeds the memory available (docs/training.md)",
    )


def resolve_auto_resume(args, default_out: str) -> bool:
    """``--resume auto`` (returns True): resume when ``--out`` holds a checkpoint; otherwise start the run,
    replacing what a start killed before its first checkpoint left (its metrics, tokenizer and trackers' files), and nothing else."""
    if args.resume != AUTO:
        return False
    out = Path(args.out or default_out)
    args.resume = (out / CHECKPOINT_FILE).is_file()
    if not args.resume and set(existing_run_files(out)) <= set(STARTED_FILES):
        args.overwrite = True
    return True


@contextlib.contextmanager
def finished_is_done(auto: bool):
    """With ``--resume auto``, a run that already finished is a success with nothing to do (a restart that
    came after the end: torchrun --max-restarts), said on stderr; with ``--resume`` it is refused."""
    try:
        yield
    except RunFinished as finished:
        if not auto:
            raise
        print(f"tokenmix: {str(finished).removeprefix('--resume: ').split(';')[0]}: nothing to do", file=sys.stderr)


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("train", help="train a model (defaults: the TNN char-LM demo on Shakespeare)")
    add_run_flags(parser, asdict(TrainConfig()))
    parser.add_argument("--sample-tokens", type=Integer(0), default=300, help="length of the sample printed after training (0: none)")
    parser.set_defaults(handler=run_train)


def given_settings(args) -> dict:
    """The TrainConfig settings given as flags (a time budget replaces a step count and back)."""
    given = {spec.name: getattr(args, spec.name) for spec in fields(TrainConfig) if getattr(args, spec.name, None) is not None}
    if args.option:
        given["options"] = dict(args.option)
    if "minutes" in given and "steps" not in given:
        given["steps"] = None
    if "steps" in given and "minutes" not in given:
        given["minutes"] = None
    return given


def train_config_from_args(args) -> TrainConfig:
    """The run's settings: the options given on the command line over the defaults, or over the
    checkpoint's settings with ``--resume`` (so a resume need not repeat them)."""
    given = given_settings(args)
    if not args.resume:
        notes: list[str] = []
        config = TrainConfig(**apply_recipe(given.pop("recipe", None), given, notes))
        for note in notes:
            print(note, file=sys.stderr)
        return config
    given = apply_recipe(given.pop("recipe", None), given, [])  # a recipe's settings are checked against the run's, as flags are
    file = resolve_checkpoint(Path(given.get("out", TrainConfig.out)))
    saved = asdict(train_config_of(load_checkpoint(file), file))  # the checkpoint's own settings, checked before flags change them
    if "options" in given:  # -o adds to the run's options
        given["options"] = {**saved.get("options", {}), **given["options"]}
    return TrainConfig.from_dict({**saved, **given})


def run_train(args) -> int:
    with user_input():
        auto, trainer = resolve_auto_resume(args, TrainConfig.out), None
        with finished_is_done(auto):
            trainer = make_trainer(train_config_from_args(args), args)
    return run_training(trainer, "train", args.sample_tokens) if trainer else 0


def make_trainer(config: TrainConfig, args, pretrained=None) -> Trainer:
    """The Trainer of ``train`` and ``finetune``, with their shared flags."""
    if args.allow_data_change and not args.resume:
        raise ValueError("--allow-data-change applies to --resume")
    return Trainer(
        config,
        resume=args.resume,
        overwrite=args.overwrite,
        pretrained=pretrained,
        allow_data_change=args.allow_data_change,
        memory_check=not args.no_memory_check,
    )


def run_training(trainer: Trainer, command: str, sample_tokens: int) -> int:
    """Train, print what came of it; exit status 130 when a signal stopped it, 1 when it diverged."""
    config = trainer.config
    finished = False  # after an error no process waits for the others: torchrun stops them
    try:
        final = trainer.run()
        if trainer.dims.is_main:
            if "seconds_per_step" in final:
                speed = f"{final['seconds_per_step']:.3f} s/step, {final['train_tokens_per_s']:,.0f} tokens/s"
                print(f"training: {trainer.step} steps, {speed}, {trainer.model.num_parameters():,} parameters")
            print(f"validation: {describe(final)}")
            peak = f"; peak memory {final['peak_memory_gb']:.2f} GB" if "peak_memory_gb" in final else ""
            print(f"this session: {final['session_minutes']:.1f} minutes from reading the data to the final validation{peak}")
            if config.task == "lm" and trainer.objective.text and sample_tokens > 0:
                tokenizer = trainer.tokenizer
                prompt = tokenizer.encode(DEMO_PROMPT).long()
                with kernels(config.kernels):
                    new = generate(trainer.whole_model(), [prompt], sample_tokens, temperature=0.8, top_k=40, seed=config.seed)[0]
                print("sample:\n" + DEMO_PROMPT + printable(tokenizer.decode(new.tolist())))
            print(f"saved: {config.out}/checkpoint.pt and {config.out}/model/")
        finished = True
    except TrainingInterrupted as stopped:  # every process stopped at the same step
        finished = True
        print(f"tokenmix {command}: {stopped}", file=sys.stderr)
        return INTERRUPTED_STATUS
    except TrainingDiverged as diverged:  # every process agreed on it
        finished = True
        print(f"tokenmix {command}: {diverged}", file=sys.stderr)
        return 1
    finally:
        trainer.close(wait=finished)
    return 0
