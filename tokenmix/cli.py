"""``tokenmix`` command line: train, eval, generate, plot, bench."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields

import torch

from .cli_args import parse_lengths, parse_option
from .data.corpus import BYTE_VOCAB
from .data.recall import AssociativeRecall
from .data.sources import load_data
from .runtime import retain_freed_memory
from .table import format_table
from .train.checkpoint import model_from_checkpoint
from .train.evaluate import describe, evaluate_lm, evaluate_mlm, evaluate_recall
from .train.generate import generate
from .train.loop import TrainConfig, Trainer

DEMO_PROMPT = "ROMEO.\n"


def _add_train(subparsers) -> None:
    parser = subparsers.add_parser("train", help="train a model (defaults: the TNN char-LM demo on Shakespeare)")
    defaults = TrainConfig()
    helps = {
        "model": "model name (tnn, ...)",
        "task": "lm (causal) or mlm (masked, bidirectional)",
        "data": "shakespeare (embedded), a .txt file or directory, bytes:FILE (enwik8 layout), or assoc-recall[:vocab=V]",
        "steps": f"optimizer steps, {TrainConfig.steps} unless --minutes is given",
        "minutes": "time budget: steps are fixed from the speed of the first steps",
        "schedule": "cosine, inverse_sqrt or constant (after linear warmup)",
        "threads": "torch CPU threads (default: torch's choice)",
        "eval_tokens": "validation tokens used at each periodic evaluation (the final one uses all)",
        "out": "run directory: checkpoint.pt, metrics.jsonl, model/",
    }
    for spec in fields(TrainConfig):
        if spec.name == "options":
            continue
        default = None if spec.name == "steps" else getattr(defaults, spec.name)
        kind = {"int": int, "float": float, "str": str}.get(str(spec.type).split(" | ")[0], str)
        parser.add_argument(
            f"--{spec.name.replace('_', '-')}", type=kind, default=default, help=f"{helps.get(spec.name, '')} (default: {default})"
        )
    parser.add_argument(
        "-o",
        "--option",
        type=parse_option,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="model/mixer option, e.g. -o decay=1.0 -o rpe_layers=1",
    )
    parser.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    parser.add_argument("--sample-tokens", type=int, default=300, help="length of the sample printed after training")
    parser.set_defaults(handler=run_train)


def run_train(args) -> int:
    values = {spec.name: getattr(args, spec.name) for spec in fields(TrainConfig) if spec.name != "options"}
    if values["steps"] is None and values["minutes"] is None:
        values["steps"] = TrainConfig.steps
    config = TrainConfig(**values, options=dict(args.option))
    trainer = Trainer(config, resume=args.resume)
    try:
        final = trainer.run()
        if trainer.context.is_main:
            if "seconds_per_step" in final:
                speed = f"{final['seconds_per_step']:.3f} s/step, {final['train_tokens_per_s']:,.0f} tokens/s"
                print(f"training: {trainer.step} steps, {speed}, {trainer.model.num_parameters():,} parameters")
            print(f"validation: {describe(final)}")
            if config.task == "lm" and not trainer.recall and args.sample_tokens > 0:
                prompt = torch.tensor(list(DEMO_PROMPT.encode()), dtype=torch.long)
                generator = torch.Generator().manual_seed(config.seed)
                new = generate(trainer.model, prompt, args.sample_tokens, 0.8, 40, generator)
                print("sample:\n" + DEMO_PROMPT + bytes(new.tolist()).decode("utf-8", errors="replace"))
            print(f"saved: {config.out}/checkpoint.pt and {config.out}/model/")
    finally:
        trainer.close()
    return 0


def _add_eval(subparsers) -> None:
    parser = subparsers.add_parser("eval", help="loss / BPC (recall: accuracy) of checkpoints at one or more lengths")
    parser.add_argument("checkpoint", nargs="+", help="checkpoint.pt or its run directory; several give one table")
    parser.add_argument("--split", default="test", choices=["train", "val", "test"])
    parser.add_argument(
        "--lengths", type=parse_lengths, default=None, help="comma-separated, e.g. 512,1024,2048,4096 (default: the training length)"
    )
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=None, help="evaluate only the first N tokens of the split")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--device", default="cpu")
    parser.set_defaults(handler=run_eval)


def _evaluate_at(model, train_config: dict, length: int, args) -> dict:
    """The metrics of one evaluation length (a recall task is regenerated at that length)."""
    data = load_data(train_config["data"], length, train_config["seed"])
    if isinstance(data, AssociativeRecall):
        return evaluate_recall(model, *data.split(args.split), args.batch_size)
    data = data.split(args.split)
    if model.config.task == "mlm":
        return evaluate_mlm(model, data, length, BYTE_VOCAB, args.batch_size, args.max_tokens, train_config["seed"])
    return evaluate_lm(model, data, length, args.batch_size, args.max_tokens)


def _evaluate_run(checkpoint: str, args) -> dict:
    """One checkpoint at every requested length: its description and a row per length."""
    model, train_config = model_from_checkpoint(checkpoint, args.device)
    lengths = args.lengths or [train_config["seq_len"]]
    rows = [{"length": length, **_evaluate_at(model, train_config, length, args)} for length in lengths]
    for row in rows:  # length extrapolation: how the loss changes against the first length
        row["loss_vs_first"] = row["loss"] / rows[0]["loss"] - 1.0
    return {
        "checkpoint": str(checkpoint),
        "model": model.config.name,
        "task": model.config.task,
        "parameters": model.num_parameters(),
        "data": train_config["data"],
        "split": args.split,
        "train_length": train_config["seq_len"],
        "recurrent": model.recurrent,
        "results": rows,
    }


def _shown(rows: list[dict]) -> tuple[list[dict], list[str]]:
    """Rows formatted for the table (percentages) and the metric columns they have."""
    shown = [{**row, "loss_vs_first": f"{row['loss_vs_first']:+.2%}"} for row in rows]
    if "accuracy" in rows[0]:
        shown = [{**row, "accuracy": f"{row['accuracy']:.2%}"} for row in shown]
        return shown, ["length", "loss", "accuracy", "examples", "loss_vs_first"]
    return shown, ["length", "loss", "bpc", "ppl", "tokens", "loss_vs_first"]


def run_eval(args) -> int:
    results = [_evaluate_run(checkpoint, args) for checkpoint in args.checkpoint]
    if len(results) == 1:
        (result,) = results
        reading = "contiguous streams, memory carried across segments" if result["recurrent"] else "independent windows"
        print(f"{result['model']} ({result['task']}, {result['parameters']:,} parameters) on the {args.split} split of {result['data']}")
        print(f"trained at length {result['train_length']}; evaluated on {reading}")
        shown, columns = _shown(result["results"])
        print(format_table(shown, columns))
    else:
        if len({"accuracy" in result["results"][0] for result in results}) > 1:
            raise ValueError("checkpoints in one table must share a kind of data: recall runs and corpus runs apart")
        print(f"{len(results)} runs on the {args.split} split")
        table = []
        for result in results:
            shown, columns = _shown(result["results"])
            described = {"run": result["checkpoint"], "model": result["model"], "parameters": result["parameters"]}
            table += [{**described, **row} for row in shown]
        print(format_table(table, ["run", "model", "parameters", *columns]))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results[0] if len(results) == 1 else results, handle, indent=2)
    return 0


def _add_generate(subparsers) -> None:
    parser = subparsers.add_parser("generate", help="sample text from a causal LM checkpoint")
    parser.add_argument("checkpoint", help="checkpoint.pt or its run directory")
    parser.add_argument("--prompt", default=DEMO_PROMPT)
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--temperature", type=float, default=0.8, help="0 for greedy")
    parser.add_argument("--top-k", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.set_defaults(handler=run_generate)


def run_generate(args) -> int:
    model, _ = model_from_checkpoint(args.checkpoint, args.device)
    prompt = torch.tensor(list(args.prompt.encode()), dtype=torch.long)
    new = generate(model, prompt, args.max_new_tokens, args.temperature, args.top_k, torch.Generator().manual_seed(args.seed))
    print(args.prompt + bytes(new.tolist()).decode("utf-8", errors="replace"))
    return 0


def _add_plot(subparsers) -> None:
    parser = subparsers.add_parser("plot", help="PNG pictures: random FD responses (no RUN), or a trained run's Toeplitz operators")
    parser.add_argument("run", nargs="?", help="checkpoint.pt or its run directory; without it: random FD RPEs")
    parser.add_argument("--out", default="plots", help="output directory (created)")
    parser.add_argument("--length", type=int, default=256, help="sequence length of the pictured operators")
    parser.add_argument("--channel", type=int, default=0)
    parser.set_defaults(handler=run_plot)


def run_plot(args) -> int:
    from .plots import plot_fd_responses, plot_operators

    if args.run is None:
        files = [plot_fd_responses(f"{args.out}/fd_responses_random.png", n=args.length)]
    else:
        model, _ = model_from_checkpoint(args.run)
        files = plot_operators(model, args.out, n=args.length, channel=args.channel)
    print("\n".join(map(str, files)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tokenmix", description="Fast token mixers for long sequences: train, evaluate, generate, plot, benchmark."
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_train(subparsers)
    _add_eval(subparsers)
    _add_generate(subparsers)
    _add_plot(subparsers)
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
        return args.handler(args)
    except ValueError as error:
        parser.exit(2, f"tokenmix {args.command}: error: {error}\n")


if __name__ == "__main__":
    sys.exit(main())
