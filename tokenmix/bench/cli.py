"""``tokenmix bench``: speed and memory of mixers, layers and models, with plots and a report."""

from __future__ import annotations

import json
import platform
import shlex
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..cli_args import parse_lengths, parse_names, parse_option
from ..mixers.registry import list_mixers
from ..models.registry import list_models
from ..table import format_table
from .cases import DTYPES, KINDS, Case, batch_for, supports
from .measure import measure
from .report import TABLE_COLUMNS, comparison_rows, markdown_report, write_plots
from .worker import run_in_subprocess

QUICK = {"lengths": [256, 1024], "dim": 384, "model_dim": 128, "repeats": 3}


def add_bench(subparsers) -> None:
    parser = subparsers.add_parser("bench", help="time and memory of mixers, layers and models against the FFT floor")
    parser.add_argument("--mixers", type=parse_names, default=None, help="comma-separated mixer names (default: all)")
    parser.add_argument("--models", type=parse_names, default=None, help="models whose layer and whole model are timed (default: all)")
    parser.add_argument("--kinds", type=parse_names, default=list(KINDS), help="any of mixer,layer,model (default: all)")
    parser.add_argument("--lengths", type=parse_lengths, default=[512, 2048, 8192])
    parser.add_argument("--dim", type=int, default=1536, help="mixer channels (default 1536: the GTU width of a 512-dim TNN)")
    parser.add_argument("--model-dim", type=int, default=512, help="width of the layers and models (default 512)")
    parser.add_argument("--batch-tokens", type=int, default=4096, help="batch = max(1, batch_tokens // length)")
    parser.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--quick", action="store_true", help="a small subset: lengths 256,1024, dims 384/128, 3 repeats")
    parser.add_argument(
        "-o",
        "--option",
        action="append",
        type=parse_option,
        default=[],
        metavar="KEY=VALUE",
        help="an option for every benchmarked mixer (layer, model), e.g. -o path=sparse; NAME.KEY=VALUE for one name only",
    )
    parser.add_argument("--output", default=None, metavar="FILE.json", help="write one JSON record per measurement")
    parser.add_argument("--plot", default=None, metavar="DIR", help="write PNG plots into DIR")
    parser.add_argument("--report", default=None, metavar="FILE.md", help="write a Markdown report (tables, plots, reading)")
    parser.set_defaults(handler=run_bench)


def options_for(name: str, options: list[tuple[str, object]]) -> dict:
    """The options of one benchmarked name: KEY=VALUE apply to every name, NAME.KEY=VALUE to NAME only."""
    chosen = {}
    for key, value in options:
        scope, dot, option = key.rpartition(".")
        if not dot or scope == name:
            chosen[option] = value
    return chosen


def bench_cases(args) -> list[Case]:
    args.mixers = args.mixers or list_mixers()
    args.models = args.models or list_models()
    causal_modes = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    unknown = sorted(set(args.kinds) - set(KINDS))
    if unknown:
        raise ValueError(f"kinds must be among {list(KINDS)}, got {unknown}")
    cases = []
    for kind in KINDS:
        if kind not in args.kinds:
            continue
        names, dim = (args.mixers, args.dim) if kind == "mixer" else (args.models, args.model_dim)
        for name in names:
            known = list_mixers() if kind == "mixer" else list_models()
            if name not in known:
                raise ValueError(f"{'mixer' if kind == 'mixer' else 'model'} name must be one of {known}, got {name!r}")
            for causal in causal_modes:
                if not supports(kind, name, causal):
                    continue
                for length in args.lengths:
                    batch = batch_for(length, args.batch_tokens)
                    options = options_for(name, args.option)
                    cases.append(Case(kind, name, causal, length, dim, batch, args.dtype, args.device, options))
    return cases


def run_bench(args) -> int:
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    cases = bench_cases(args)
    torch.set_num_threads(args.threads)
    in_process = torch.device(args.device).type == "cuda"
    records = []
    for case in tqdm(cases, desc="bench", unit="case"):
        measurement = measure(case, args.repeats) if in_process else run_in_subprocess(case, args.repeats, args.threads)
        records.append(measurement.to_dict())
    machine = f"{platform.machine()}, {args.threads} threads, torch {torch.__version__}, {args.device}, {args.dtype}"
    print(f"# {machine}; batch*length {args.batch_tokens}, median of {args.repeats}")
    print(format_table(records, TABLE_COLUMNS))
    for path in (args.output, args.report):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
    if args.output:
        Path(args.output).write_text(json.dumps(records, indent=2) + "\n")
    plots = write_plots(records, args.plot) if args.plot else []
    if args.report:
        command = "tokenmix " + " ".join(shlex.quote(argument) for argument in args.argv)
        Path(args.report).write_text(markdown_report(records, command, machine, plots, args.report))
    return 0


def add_compare(subparsers) -> None:
    parser = subparsers.add_parser("compare", help="compare two `tokenmix bench --output` JSON files (before, after)")
    parser.add_argument("before", help="JSON of the earlier measurement")
    parser.add_argument("after", help="JSON of the later measurement")
    parser.set_defaults(handler=run_compare)


def _read_records(path: str) -> list[dict]:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{path!r} is not a readable bench JSON file: {error}") from None


def run_compare(args) -> int:
    rows = comparison_rows(_read_records(args.before), _read_records(args.after))
    if not rows:
        raise ValueError("the two files share no (kind, mixer, causal, length) measurement")
    print(format_table(rows, list(rows[0])))
    return 0
