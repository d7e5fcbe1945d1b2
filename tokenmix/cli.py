"""``tokenmix`` command line: train, finetune, eval, generate, plot, recipes, export-hf, bench, compare.

Each command reads and checks its input (arguments, data, checkpoints) inside ``user_input()``:
a problem there is reported in one line (exit status 2). Errors after that are bugs and keep
their traceback. Ctrl-C during training saves a checkpoint and exits with status 130.
"""

from __future__ import annotations

import argparse
import codecs
import functools
import json
import sys
import time
import unicodedata
import warnings
from dataclasses import asdict, fields
from pathlib import Path

import torch

from .data.sources import load_data
from .data.tokenizer import Tokenizer
from .errors import UsageError, user_input
from .fields import Choice, Existing, Integer, KeyValue, Lengths, Number, Output, Text, check_output_path
from .files import write_json_atomic
from .generation import StopRule, check_sampling, generate, naive_generate
from .mixers.registry import list_mixers
from .models.registry import list_models
from .runtime import retain_freed_memory, set_threads
from .table import format_table
from .train.checkpoint import load_checkpoint, model_from_checkpoint, resolve_checkpoint, train_config_of
from .train.config import DEVICE, TrainConfig
from .train.evaluate import EVAL_BATCH, SCORES, describe
from .train.finetune import FROM_PRETRAINED, finetune_settings, read_pretrained
from .train.loop import Trainer, TrainingDiverged, TrainingInterrupted
from .train.objectives import objective_class, objective_for
from .train.recipes import apply_recipe, list_recipes, recipe
from .train.runs import training_cost
from .version import __version__, source_revision

DEMO_PROMPT = "ROMEO.\n"
INTERRUPTED_STATUS = 130

THREADS = Integer(1)
DEVICE_HELP = TrainConfig.__dataclass_fields__["device"].metadata["help"]
RUN = Existing("a checkpoint.pt or its run directory")
OPTION = KeyValue("KEY=VALUE")


def _add_threads_and_device(parser, device_default: str = "cpu") -> None:
    parser.add_argument("--threads", type=THREADS, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--device", type=DEVICE, default=device_default, help=f"{DEVICE_HELP} (default: {device_default})")


def _use_threads(args) -> None:
    if args.threads:
        set_threads(args.threads)


def _add_run_flags(parser, defaults: dict, skipped: tuple[str, ...] = (), helps: dict | None = None) -> None:
    """A flag per TrainConfig field (but ``skipped``) with its kind, help (``helps`` override some) and the
    default a help line shows (``defaults``), -o options, --resume / --overwrite."""
    for spec in fields(TrainConfig):
        if spec.name == "options" or spec.name in skipped:
            continue
        flag = f"--{spec.name.replace('_', '-')}"
        kind, help_text = spec.metadata["kind"], (helps or {}).get(spec.name, spec.metadata["help"])
        if kind is None:  # a switch
            parser.add_argument(flag, action="store_true", default=None, help=help_text)
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
    run.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint (its settings are kept)")
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


def _add_train(subparsers) -> None:
    parser = subparsers.add_parser("train", help="train a model (defaults: the TNN char-LM demo on Shakespeare)")
    _add_run_flags(parser, asdict(TrainConfig()))
    parser.add_argument("--sample-tokens", type=Integer(0), default=300, help="length of the sample printed after training (0: none)")
    parser.set_defaults(handler=run_train)


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


def _add_finetune(subparsers) -> None:
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
    _add_run_flags(parser, defaults, skipped=(*FROM_PRETRAINED, "recipe"), helps={"data": data})
    parser.set_defaults(handler=run_finetune, sample_tokens=0)


def _given_settings(args) -> dict:
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
    given = _given_settings(args)
    if not args.resume:
        notes: list[str] = []
        config = TrainConfig(**apply_recipe(given.pop("recipe", None), given, notes))
        for note in notes:
            print(note, file=sys.stderr)
        return config
    if "recipe" in given:
        raise ValueError("--recipe starts a run; --resume continues one with the settings it was started with")
    file = resolve_checkpoint(Path(given.get("out", TrainConfig.out)))
    saved = asdict(train_config_of(load_checkpoint(file), file))  # the checkpoint's own settings, checked before flags change them
    if "options" in given:  # -o adds to the run's options
        given["options"] = {**saved.get("options", {}), **given["options"]}
    return TrainConfig.from_dict({**saved, **given})


def run_train(args) -> int:
    with user_input():
        trainer = _trainer(train_config_from_args(args), args)
    return _run(trainer, "train", args.sample_tokens)


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
            config = TrainConfig(**finetune_settings(pretrained, args.pretrained, {**FINETUNE_DEFAULTS, **_given_settings(args)}))
        trainer = _trainer(config, args, pretrained)
    return _run(trainer, "finetune", sample_tokens=0)


def _trainer(config: TrainConfig, args, pretrained=None) -> Trainer:
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


def _run(trainer: Trainer, command: str, sample_tokens: int) -> int:
    """Train, print what came of it; exit status 130 when a signal stopped it, 1 when it diverged."""
    config = trainer.config
    try:
        final = trainer.run()
        if trainer.context.is_main:
            if "seconds_per_step" in final:
                speed = f"{final['seconds_per_step']:.3f} s/step, {final['train_tokens_per_s']:,.0f} tokens/s"
                print(f"training: {trainer.step} steps, {speed}, {trainer.model.num_parameters():,} parameters")
            print(f"validation: {describe(final)}")
            peak = f"; peak memory {final['peak_memory_gb']:.2f} GB" if "peak_memory_gb" in final else ""
            print(f"this session: {final['session_minutes']:.1f} minutes from reading the data to the final validation{peak}")
            if config.task == "lm" and trainer.objective.text and sample_tokens > 0:
                tokenizer = trainer.tokenizer
                prompt = tokenizer.encode(DEMO_PROMPT).long()
                new = generate(trainer.model, [prompt], sample_tokens, temperature=0.8, top_k=40, seed=config.seed)[0]
                print("sample:\n" + DEMO_PROMPT + printable(tokenizer.decode(new.tolist())))
            print(f"saved: {config.out}/checkpoint.pt and {config.out}/model/")
    except TrainingInterrupted as stopped:
        print(f"tokenmix {command}: {stopped}", file=sys.stderr)
        return INTERRUPTED_STATUS
    except TrainingDiverged as diverged:
        print(f"tokenmix {command}: {diverged}", file=sys.stderr)
        return 1
    finally:
        trainer.close()
    return 0


def _add_eval(subparsers) -> None:
    parser = subparsers.add_parser(
        "eval", help="loss / BPC of checkpoints at one or more lengths; accuracy of recall and classification runs"
    )
    parser.add_argument("checkpoint", nargs="+", type=RUN, help="checkpoint.pt or its run directory; several give one table")
    parser.add_argument(
        "--split",
        action="append",
        type=Choice(["train", "val", "test"]),
        help="data split, repeatable (default: test; classification runs: val and test)",
    )
    parser.add_argument(
        "--lengths", type=Lengths(), default=None, help="comma-separated, e.g. 512,1024,2048,4096 (default: the training length)"
    )
    parser.add_argument(
        "--batch-size", type=Integer(1), default=None, help="examples per forward pass (default: 8, or the run's batch size if smaller)"
    )
    parser.add_argument("--max-tokens", type=Integer(1), default=None, help="evaluate only the first N tokens of the split")
    parser.add_argument(
        "--json", type=Output("a JSON file to write", folder=False), default=None, metavar="FILE", help="also write the results as JSON"
    )
    _add_threads_and_device(parser)
    parser.set_defaults(handler=run_eval)


@functools.cache
def _load_data(source: str, length: int, seed: int, tokenizer):
    return load_data(source, length, seed, tokenizer or "bytes")


def _objective(model, train_config: dict, tokenizer, length: int):
    """The run's objective on its data in its tokenizer's ids (a recall task is regenerated at
    ``length``; data read once per process)."""
    data = _load_data(train_config["data"], length, train_config["seed"], tokenizer)
    return objective_for(data, model.config.task, train_config["seed"])


TRAINING_COLUMNS = {  # a multi-run table's columns for each run's last training session: name, meaning
    "session_minutes": ("train_min", "wall time from reading the data to the final validation"),
    "peak_memory_gb": ("train_peak_gb", "peak memory"),
    "estimated_peak_gb": ("est_peak_gb", "peak memory estimated before the first step"),
}


def _evaluate_run(model, train_config: dict, tokenizer, checkpoint: str, args) -> dict:
    """One checkpoint: its description and a row per length (language models, recall) or per split
    (classification: val and test unless --split is given)."""
    splits = args.split or (["val", "test"] if model.config.task == "classify" else ["test"])
    lengths = args.lengths or [train_config["seq_len"]]
    batch_size = args.batch_size or min(EVAL_BATCH, train_config["batch_size"])
    rows = []
    for length in lengths:
        objective = _objective(model, train_config, tokenizer, length)
        for split in splits:
            metrics = objective.evaluate(model, split, length=length, max_tokens=args.max_tokens, batch_size=batch_size)
            rows.append({"split": split, "length": length, **metrics})
    for row in rows:  # length extrapolation: how the loss changes against the first length
        first = next(other for other in rows if other["split"] == row["split"])
        row["loss_vs_first"] = row["loss"] / first["loss"] - 1.0
    return {
        "checkpoint": str(checkpoint),
        "model": model.config.name,
        "task": model.config.task,
        "parameters": model.num_parameters(),
        "data": train_config["data"],
        "tokenizer": None if tokenizer is None else tokenizer.name,
        "splits": splits,
        "train_length": train_config["seq_len"],
        "recurrent": model.recurrent,
        "results": rows,
        "training": training_cost(resolve_checkpoint(checkpoint).parent),
        "tokenmix_version": __version__,
        "git_commit": source_revision(),
    }


def _shown(rows: list[dict], task: str) -> tuple[list[dict], list[str]]:
    """Rows formatted for the table (percentages) and the metric columns they have."""
    shown = [{**row, "loss_vs_first": f"{row['loss_vs_first']:+.2%}"} for row in rows]
    scores = [name for name in SCORES if name in rows[0]]
    shown = [{**row, **({"accuracy": f"{row['accuracy']:.2%}"} if "accuracy" in row else {})} for row in shown]
    if task == "classify":  # whole examples: the length plays no part
        floor = ["majority_class"] if "majority_accuracy" in rows[0] else []
        shown = [{**row, **({"majority_class": f"{row['majority_accuracy']:.2%}"} if floor else {})} for row in shown]
        return shown, ["split", "loss", *scores, *floor, "examples"]
    if scores:
        return shown, ["split", "length", "loss", *scores, "examples", "loss_vs_first"]
    words = ["word_ppl"] if "word_ppl" in rows[0] else []
    return shown, ["split", "length", "loss", "ppl", "bpb", *words, "tokens", "loss_vs_first"]


def run_eval(args) -> int:
    with user_input():
        _use_threads(args)
        check_output_path(args.json, "--json")
        runs = [(*model_from_checkpoint(checkpoint, args.device), checkpoint) for checkpoint in args.checkpoint]
        kinds = {(objective_class(train_config["data"]).kind, model.config.task) for model, train_config, _, _ in runs}
        if len(kinds) > 1:
            raise ValueError(f"checkpoints in one table must share a kind of data and task; these have {sorted(kinds)}")
        if args.lengths and runs[0][0].config.task == "classify":
            raise ValueError("--lengths applies to language models and recall; a classifier reads whole examples of the data's own lengths")
        for model, train_config, tokenizer, _ in runs:
            _objective(model, train_config, tokenizer, train_config["seq_len"])  # the data is still where it was
    results = [_evaluate_run(*run, args) for run in runs]
    if len(results) == 1:
        (result,) = results
        splits = " and ".join(result["splits"])
        noun = "splits" if len(result["splits"]) > 1 else "split"
        tokens = f", {result['tokenizer']} tokens" if result["tokenizer"] not in (None, "bytes") else ""
        print(
            f"{result['model']} ({result['task']}, {result['parameters']:,} parameters{tokens}) on the {splits} {noun} of {result['data']}"
        )
        if result["task"] != "classify":
            reading = "contiguous streams, memory carried across segments" if result["recurrent"] else "independent windows"
            print(f"trained at length {result['train_length']}; evaluated on {reading}")
        shown, columns = _shown(result["results"], result["task"])
        print(format_table(shown, columns))
    else:
        sources = sorted({result["data"] for result in results})
        print(f"{len(results)} runs on {' and '.join(sources)}")
        varying = [
            key for key in ("data", "tokenizer") if len({str(result[key]) for result in results}) > 1
        ]  # columns that tell runs apart
        costs = [key for key in TRAINING_COLUMNS if all(key in result["training"] for result in results)]
        table = []
        for result in results:
            shown, columns = _shown(result["results"], result["task"])
            described = {"run": result["checkpoint"], "model": result["model"], "parameters": result["parameters"]}
            cost = {TRAINING_COLUMNS[key][0]: f"{result['training'][key]:.2f}" for key in costs}
            table += [{**described, **{key: result[key] for key in varying}, **cost, **row} for row in shown]
        print(format_table(table, ["run", "model", *varying, "parameters", *(TRAINING_COLUMNS[key][0] for key in costs), *columns]))
        for key in costs:
            print(f"{TRAINING_COLUMNS[key][0]}: the last training session's {TRAINING_COLUMNS[key][1]}")
    if args.json:
        write_json_atomic(args.json, results[0] if len(results) == 1 else results)
    return 0


def _add_generate(subparsers) -> None:
    parser = subparsers.add_parser("generate", help="sample text from a causal LM checkpoint (cached: one step per token)")
    parser.add_argument("checkpoint", type=RUN, help="checkpoint.pt or its run directory (with --transformers: an export-hf folder)")
    parser.add_argument(
        "--prompt",
        action="append",
        type=Text("a prompt"),
        help="text a sample continues; repeat for several, decoded as one batch (default: the demo's 'ROMEO.')",
    )
    parser.add_argument("--max-new-tokens", type=Integer(0), default=200, help="tokens to add to each prompt, any number (default: 200)")
    parser.add_argument("--temperature", type=Number(0), default=0.8, help="sampling temperature; 0 is greedy (default: 0.8)")
    parser.add_argument("--top-k", type=Integer(0), default=40, help="sample among the k most likely tokens; 0 turns it off (default: 40)")
    parser.add_argument(
        "--top-p",
        type=Number(0, 1, open_minimum=True),
        help="sample among the most likely tokens that hold this probability, in (0, 1]",
    )
    parser.add_argument(
        "--stop", type=Text("a stop text"), help="text that ends a sample, kept at its end (\\n stands for a newline, \\t for a tab)"
    )
    parser.add_argument("--stream", action="store_true", help="print text as it is produced (several prompts: one after another)")
    parser.add_argument(
        "--seed", type=Integer(0), default=0, help="seed of the sampling: prompt i samples with the generator of (seed, i) (default: 0)"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="with --temperature 0: also decode by re-running the whole sequence per token, compare, time both",
    )
    parser.add_argument(
        "--transformers",
        action="store_true",
        help="CHECKPOINT is a folder written by `tokenmix export-hf`: generate with transformers' AutoModelForCausalLM (docs/hf.md)",
    )
    _add_threads_and_device(parser)
    parser.set_defaults(handler=run_generate)


def printable(data: bytes) -> str:
    """Decoded text with control characters other than newline and tab shown as escapes (\\x1b, ...)."""
    return _escaped(data.decode("utf-8", errors="replace"))


def _escaped(text: str) -> str:
    return "".join(f"\\x{ord(c):02x}" if unicodedata.category(c) == "Cc" and c not in "\n\t" else c for c in text)


class TextStream:
    """Prints a sample's bytes as text as they arrive (a character split across tokens waits for its
    last byte), and nothing after the end of the stop text once it has come."""

    def __init__(self, stop: StopRule):
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.stop, self.sample, self.done = stop, b"", False

    def write(self, data: bytes, final: bool = False) -> None:
        sys.stdout.write(_escaped(self.decoder.decode(data, final)))
        sys.stdout.flush()

    def write_sample(self, data: bytes) -> None:
        """Bytes of generated tokens: written up to the end of the stop text."""
        if self.done:
            return
        cut = self.stop.cut(self.sample + data)
        self.done = self.stop.text is not None and self.stop.text in cut
        self.write(cut[len(self.sample) :])
        self.sample = cut


def _speed(tokens: int, seconds: float) -> str:
    return f"{tokens} tokens in {seconds:.2f} s ({tokens / max(seconds, 1e-9):.1f} tokens/s)"


def run_transformers_generate(args) -> int:
    """``generate --transformers``: the exported folder through transformers' Auto classes alone."""
    with user_input():
        _use_threads(args)
        try:
            from .hf.export import check_export
            from .hf.sampling import transformers_generate
        except ImportError as error:
            raise ValueError(str(error)) from None
        if args.stop or args.stream or args.check:
            raise ValueError("--transformers generates with transformers' generate(): without --stop, --stream or --check")
        check_export(args.checkpoint)
        tokenizer = Tokenizer.load(args.checkpoint)  # exact bytes of the ids transformers chose
        texts = args.prompt or [DEMO_PROMPT]
        if any(not text for text in texts):
            raise ValueError("--prompt must not be empty")
        options = {"temperature": args.temperature, "top_k": args.top_k or None, "top_p": args.top_p, "seed": args.seed}
        check_sampling(**options)
    samples, seconds = transformers_generate(args.checkpoint, texts, args.max_new_tokens, **options)
    print("\n---\n".join(printable(text.encode() + tokenizer.decode(new)) for text, new in zip(texts, samples, strict=True)))
    print(f"transformers: {_speed(sum(map(len, samples)), seconds)}", file=sys.stderr)
    return 0


def run_generate(args) -> int:
    if args.transformers:
        return run_transformers_generate(args)
    with user_input():
        _use_threads(args)
        model, train_config, tokenizer = model_from_checkpoint(args.checkpoint, args.device)
        if model.config.task != "lm":
            raise ValueError(f"generate needs a causal LM checkpoint (task 'lm'); {args.checkpoint!r} is task {model.config.task!r}")
        if tokenizer is None:
            raise ValueError(f"generate writes text; {args.checkpoint!r} was trained on {train_config['data']!r}, which is not text")
        texts = args.prompt or [DEMO_PROMPT]
        if any(not text for text in texts):
            raise ValueError("--prompt must not be empty")
        stop = None if args.stop is None else args.stop.replace("\\n", "\n").replace("\\t", "\t")
        if stop == "":
            raise ValueError("--stop must not be empty")
        if args.check and args.temperature != 0:
            raise ValueError("--check compares greedy decoding: use it with --temperature 0")
        check_sampling(args.temperature, args.top_k or None, args.top_p, args.seed)
        prompts = [tokenizer.encode(text).long() for text in texts]
        if any(prompt.numel() == 0 for prompt in prompts):
            raise ValueError("--prompt: a prompt encodes to no tokens")
    rule = StopRule(stop, model.config.vocab_size, tokenizer)
    options = {
        "temperature": args.temperature,
        "top_k": args.top_k or None,
        "top_p": args.top_p,
        "stop": stop,
        "seed": args.seed,
        "tokenizer": tokenizer,
    }
    if args.stream:
        for index, (text, prompt) in enumerate(zip(texts, prompts, strict=True)):
            stream = TextStream(rule)
            stream.write(("" if index == 0 else "---\n").encode() + text.encode())  # the last sample ended its line
            write = lambda _row, token, out=stream: out.write_sample(tokenizer.token_bytes[token])  # noqa: E731
            generate(model, [prompt], args.max_new_tokens, **options, rows=[index], on_token=write)  # samples as row `index` of a batch
            stream.write(b"\n", final=True)
        return 0
    started = time.perf_counter()
    samples = generate(model, prompts, args.max_new_tokens, **options, progress=True)
    cached_seconds = time.perf_counter() - started
    shown = [printable(text.encode() + rule.cut(tokenizer.decode(new.tolist()))) for text, new in zip(texts, samples, strict=True)]
    print("\n---\n".join(shown))
    print(f"tokenmix: {_speed(sum(len(new) for new in samples), cached_seconds)}", file=sys.stderr)
    if args.check:
        return _check_against_recompute(model, prompts, samples, args.max_new_tokens, stop, tokenizer, cached_seconds)
    return 0


def _check_against_recompute(model, prompts, samples, max_new_tokens: int, stop, tokenizer, cached_seconds: float) -> int:
    """Decode again by recomputing the whole sequence per token; 0 if every token agrees, else 1."""
    started = time.perf_counter()
    references = [naive_generate(model, prompt, max_new_tokens, stop, tokenizer) for prompt in prompts]
    recompute_seconds = time.perf_counter() - started
    agreed = [torch.equal(new, reference) for new, reference in zip(samples, references, strict=True)]
    tokens = sum(len(new) for new in samples)
    times = f"cached {cached_seconds:.2f} s, recompute {recompute_seconds:.2f} s"
    verdict = "agree on every token" if all(agreed) else f"DISAGREE on prompts {[i + 1 for i, ok in enumerate(agreed) if not ok]}"
    print(
        f"check: cached and recompute generation {verdict} ({tokens} tokens; {times})",
        file=sys.stderr,
    )
    return 0 if all(agreed) else 1


def _add_plot(subparsers) -> None:
    parser = subparsers.add_parser("plot", help="PNG pictures: random FD responses (no RUN), or a trained run's Toeplitz operators")
    parser.add_argument("run", nargs="?", type=RUN, help="checkpoint.pt or its run directory; without it: random FD RPEs")
    parser.add_argument(
        "--out", type=Output("a folder for the pictures", folder=True), default="plots", help="output directory, created (default: plots)"
    )
    parser.add_argument("--length", type=Integer(1), default=256, help="sequence length of the pictured operators (default: 256)")
    parser.add_argument("--channel", type=Integer(0), help="channel pictured in a run's operator heatmaps (default: 0)")
    parser.set_defaults(handler=run_plot)


def run_plot(args) -> int:
    from .plots import plot_fd_responses, plot_operators, toeplitz_mixers

    with user_input():
        if args.run is None:
            if args.channel is not None:
                raise ValueError("--channel applies to a run's operator heatmaps: give RUN, or leave --channel out")
            check_output_path(args.out, "--out", directory=True)
            files = [plot_fd_responses(f"{args.out}/fd_responses_random.png", n=args.length)]
        else:
            channel = args.channel or 0
            model, _, _ = model_from_checkpoint(args.run)
            mixers = toeplitz_mixers(model)
            channels = min(mixer.dim for _, mixer in mixers)
            if channel >= channels:
                raise ValueError(f"--channel must be in [0, {channels - 1}]: the pictured mixers have {channels} channels")
            check_output_path(args.out, "--out", directory=True)
    if args.run is not None:
        files = plot_operators(model, args.out, n=args.length, channel=channel)
    print("\n".join(map(str, files)))
    return 0


def _add_export_hf(subparsers) -> None:
    parser = subparsers.add_parser(
        "export-hf", help="write a run for Hugging Face transformers: config.json, model.safetensors, tokenizer (docs/hf.md)"
    )
    parser.add_argument("checkpoint", type=RUN, help="checkpoint.pt or its run directory")
    parser.add_argument(
        "out", type=Output("a folder to write", folder=True), help="the folder to write (refused if it holds files, unless --overwrite)"
    )
    parser.add_argument("--overwrite", action="store_true", help="write into a folder that holds files")
    parser.set_defaults(handler=run_export_hf)


def run_export_hf(args) -> int:
    with user_input():
        try:
            from . import hf
        except ImportError as error:
            raise ValueError(str(error)) from None
        check_output_path(args.out, "out", directory=True)
        model, train_config, tokenizer = model_from_checkpoint(args.checkpoint)
        directory = hf.export(model, args.out, tokenizer, overwrite=args.overwrite)
    files = sorted(path.name for path in directory.iterdir())
    print(f"wrote {directory}: {', '.join(files)}")
    return 0


def _add_recipes(subparsers) -> None:
    parser = subparsers.add_parser("recipes", help="the presets of `tokenmix train --recipe NAME`, with their sources")
    parser.add_argument("name", nargs="?", type=Choice(list_recipes), help="one recipe: every value it sets, as train flags")
    parser.set_defaults(handler=run_recipes)


def recipe_flags(settings: dict) -> list[str]:
    """A recipe's settings as ``tokenmix train`` flags (model options as ``-o key=value``, values as -o reads them)."""

    def shown(value) -> str:
        return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))

    flags = [f"--{key.replace('_', '-')} {value}" for key, value in settings.items() if key != "options" and value is not None]
    return flags + [f"-o {key}={shown(value)}" for key, value in settings.get("options", {}).items()]


def run_recipes(args) -> int:
    with user_input():
        chosen = recipe(args.name) if args.name else None
    if chosen is None:
        width = max(map(len, list_recipes())) + 1
        for name in list_recipes():
            print(f"{name:<{width}} {recipe(name).description}")
        print("\n`tokenmix recipes NAME`: a recipe's source and values; `tokenmix train --recipe NAME [flags]` trains with them")
        return 0
    print(f"{args.name}: {chosen.description}\nsource: {chosen.source}\n")
    print(f"`tokenmix train --recipe {args.name}` trains with these settings (flags given beside it override them):")
    print(" \\\n  ".join(["tokenmix train", *recipe_flags(chosen.settings)]))
    return 0


def _add_convert_checkpoint(subparsers) -> None:
    parser = subparsers.add_parser(
        "convert-checkpoint",
        help="rewrite a checkpoint of tokenmix 0.2 or earlier (pickled objects) in today's format, which loads without running code",
    )
    parser.add_argument("checkpoint", type=RUN, help="checkpoint.pt or its run directory (the original is kept as checkpoint.pt.format1)")
    parser.add_argument(
        "--trust",
        action="store_true",
        help="you trust where the file came from: converting unpickles it once, and unpickling runs any code a file holds",
    )
    parser.set_defaults(handler=run_convert_checkpoint)


def run_convert_checkpoint(args) -> int:
    from .train.legacy_checkpoint import convert_checkpoint

    with user_input():
        if not args.trust:
            raise ValueError(
                "converting unpickles the checkpoint, which runs any code it holds: pass --trust only for a file "
                "from a source you trust (your own run of an earlier tokenmix)"
            )
        converted, original = convert_checkpoint(args.checkpoint)
    print(f"converted {converted} (the original is kept as {original})")
    return 0


class Parser(argparse.ArgumentParser):
    """argparse with its errors in one line: the problem and where the help is, without the usage block."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the options)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="tokenmix",
        description="Fast token mixers for long sequences: train, evaluate, generate, plot, benchmark.",
        epilog=f"models: {', '.join(list_models())}. mixers: {', '.join(list_mixers())}. `tokenmix COMMAND --help` for each command.",
    )
    parser.add_argument("--version", action="version", version=f"tokenmix {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_train(subparsers)
    _add_finetune(subparsers)
    _add_eval(subparsers)
    _add_generate(subparsers)
    _add_plot(subparsers)
    _add_recipes(subparsers)
    _add_export_hf(subparsers)
    _add_convert_checkpoint(subparsers)
    from .bench.cli import add_bench, add_compare

    add_bench(subparsers)
    add_compare(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    retain_freed_memory()
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    args.argv = argv
    try:
        with warnings.catch_warnings():  # a warning is one line, as errors are
            warnings.showwarning = lambda message, *_: print(f"tokenmix {args.command}: warning: {message}", file=sys.stderr)
            return args.handler(args)
    except UsageError as error:
        parser.exit(2, f"tokenmix {args.command}: error: {error}\n")
    except KeyboardInterrupt:
        parser.exit(INTERRUPTED_STATUS, f"tokenmix {args.command}: interrupted\n")


if __name__ == "__main__":
    sys.exit(main())
