"""``tokenmix eval``: loss, bits per byte or accuracy of one or more runs, as a table or JSON."""

from __future__ import annotations

import functools

from ..data.sources import load_data
from ..errors import user_input
from ..fields import Choice, Integer, Output
from ..io.files import write_json_atomic
from ..io.table import format_table
from ..runs import Run, open_run
from ..runs.metrics import training_cost
from ..train.evaluate import EVAL_BATCH, SCORES
from ..train.objectives import objective_class, objective_for
from ..version import __version__, source_revision
from .arguments import Lengths, check_output_path
from .common import RUN, add_precision, add_threads_and_device, use_threads


def add_parser(subparsers) -> None:
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
    add_threads_and_device(parser)
    add_precision(parser)
    parser.set_defaults(handler=run_eval)


@functools.cache
def _load_data(source: str, length: int, seed: int, tokenizer):
    return load_data(source, length, seed, tokenizer or "bytes")


def run_objective(model, train_config: dict, tokenizer, length: int):
    """The run's objective on its data in its tokenizer's ids (a recall task is regenerated at
    ``length``; data read once per process)."""
    data = _load_data(train_config["data"], length, train_config["seed"], tokenizer)
    return objective_for(data, model.config.task, train_config["seed"])


TRAINING_COLUMNS = {  # a multi-run table's columns for each run's last training session: name, meaning, format
    "step": ("steps", "final step (counted from the run's start)", "{:d}"),
    "seconds_per_step": ("s_per_step", "mean step time in seconds", "{:.3f}"),
    "session_minutes": ("train_min", "wall time from reading the data to the final validation", "{:.2f}"),
    "peak_memory_gb": ("train_peak_gb", "peak memory", "{:.2f}"),
    "estimated_peak_gb": ("est_peak_gb", "peak memory estimated before the first step", "{:.2f}"),
}


def _evaluate_run(run: Run, checkpoint: str, training: dict, args) -> dict:
    """One checkpoint: its description (``training``: its last session's cost) and a row per length
    (language models, recall) or per split (classification: val and test unless --split is given)."""
    model, train_config, tokenizer = run.model, run.settings, run.tokenizer
    splits = args.split or (["val", "test"] if model.config.task == "classify" else ["test"])
    lengths = args.lengths or [train_config["seq_len"]]
    batch_size = args.batch_size or min(EVAL_BATCH, train_config["batch_size"])
    rows = []
    for length in lengths:
        objective = run_objective(model, train_config, tokenizer, length)
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
        "training": training,
        "tokenmix_version": __version__,
        "git_commit": source_revision(),
    }


def _shown(rows: list[dict], task: str) -> tuple[list[dict], list[str]]:
    """Rows formatted for the table (percentages) and the metric columns they have."""
    shown = [{**row, "loss_vs_first": f"{row['loss_vs_first']:+.2%}"} for row in rows]
    scores = [name for name in SCORES if name in rows[0]]
    shown = [{**row, **({"accuracy": f"{row['accuracy']:.2%}"} if "accuracy" in row else {})} for row in shown]
    if task == "classify":  # whole examples: the length plays no part
        floors = {"majority_class": ("majority_accuracy", "{:.2%}"), "p_above_majority": ("p_above_majority", "{:.3g}")}
        floor = [column for column, (key, _) in floors.items() if key in rows[0]]
        shown = [{**row, **{column: floors[column][1].format(row[floors[column][0]]) for column in floor}} for row in shown]
        return shown, ["split", "loss", *scores, *floor, "examples"]
    if scores:
        return shown, ["split", "length", "loss", *scores, "examples", "loss_vs_first"]
    words = ["word_ppl"] if "word_ppl" in rows[0] else []
    return shown, ["split", "length", "loss", "ppl", "bpb", *words, "tokens", "loss_vs_first"]


def eval_report(results: list[dict]) -> str:
    """What ``tokenmix eval`` prints for its results (those it writes with --json): a description
    and a table for one run, one table with a row per run and length or split for several."""
    lines = []
    if len(results) == 1:
        (result,) = results
        splits = " and ".join(result["splits"])
        noun = "splits" if len(result["splits"]) > 1 else "split"
        tokens = f", {result['tokenizer']} tokens" if result["tokenizer"] not in (None, "bytes") else ""
        lines.append(
            f"{result['model']} ({result['task']}, {result['parameters']:,} parameters{tokens}) on the {splits} {noun} of {result['data']}"
        )
        if result["task"] != "classify":
            reading = "contiguous streams, memory carried across segments" if result["recurrent"] else "independent windows"
            lines.append(f"trained at length {result['train_length']}; evaluated on {reading}")
        shown, columns = _shown(result["results"], result["task"])
        lines.append(format_table(shown, columns))
    else:
        sources = sorted({result["data"] for result in results})
        lines.append(f"{len(results)} runs on {' and '.join(sources)}")
        varying = [
            key for key in ("data", "tokenizer") if len({str(result[key]) for result in results}) > 1
        ]  # columns that tell runs apart
        costs = [key for key in TRAINING_COLUMNS if all(key in result["training"] for result in results)]
        table = []
        for result in results:
            shown, columns = _shown(result["results"], result["task"])
            described = {"run": result["checkpoint"], "model": result["model"], "parameters": result["parameters"]}
            cost = {TRAINING_COLUMNS[key][0]: TRAINING_COLUMNS[key][2].format(result["training"][key]) for key in costs}
            table += [{**described, **{key: result[key] for key in varying}, **cost, **row} for row in shown]
        lines.append(format_table(table, ["run", "model", *varying, "parameters", *(TRAINING_COLUMNS[key][0] for key in costs), *columns]))
        lines += [f"{TRAINING_COLUMNS[key][0]}: the last training session's {TRAINING_COLUMNS[key][1]}" for key in costs]
    return "\n".join(lines)


def run_eval(args) -> int:
    with user_input():
        use_threads(args)
        check_output_path(args.json, "--json")
        runs = [open_run(checkpoint, device=args.device) for checkpoint in args.checkpoint]
        kinds = {(objective_class(run.training_settings("eval")["data"]).kind, run.config.task) for run in runs}
        if len(kinds) > 1:
            raise ValueError(f"checkpoints in one table must share a kind of data and task; these have {sorted(kinds)}")
        if args.lengths and runs[0].config.task == "classify":
            raise ValueError("--lengths applies to language models and recall; a classifier reads whole examples of the data's own lengths")
        for run in runs:
            run.model.precision = args.precision
            run_objective(run.model, run.settings, run.tokenizer, run.settings["seq_len"])  # the data is still where it was
        costs = [training_cost(run.directory) for run in runs]  # a damaged metrics.jsonl is refused here
    results = [_evaluate_run(*entry, args) for entry in zip(runs, args.checkpoint, costs, strict=True)]
    print(eval_report(results))
    if args.json:
        write_json_atomic(args.json, results[0] if len(results) == 1 else results)
    return 0
