"""``tokenmix bench``: speed and memory of mixers, layers and models, decoding speed, with plots and a report."""

from __future__ import annotations

import importlib.util
import json
import math
import platform
import shlex
import warnings
from dataclasses import replace
from pathlib import Path

import torch

from ..compilation import COMPILE_MODES
from ..devices import resolve_device
from ..errors import user_input
from ..fields import Choice, Cpus, Existing, Integer, KeyValue, Lengths, Names, Number, Output, check_output_path
from ..files import write_json_atomic, write_text_atomic
from ..mixers.registry import list_mixers
from ..models.distil import distilled_options
from ..models.registry import list_models, resolve_model_options
from ..parallel.dims import init_distributed
from ..precision import PRECISIONS
from ..progress import progress_bar
from ..runtime import retain_freed_memory, set_threads
from ..table import format_table
from ..train.config import DEVICE
from ..version import source_revision
from .cases import CASE_KINDS, DTYPES, GENERATE_DEPTH, GENERATE_KINDS, KINDS, MIXER_KINDS, TRAINING_KINDS, Case, batch_for, supports
from .measure import measure
from .records import failed_measurement
from .report import (
    COMPARED_SETTINGS,
    CONDITIONS,
    comparison_rows,
    condition_differences,
    markdown_report,
    sections,
    table_columns,
    write_plots,
)
from .scale import SCALE_KINDS, scale_records, scale_tables, write_scale_plots
from .serve import SERVE, SERVE_KINDS, serve_records, serve_tables, write_serve_plots
from .worker import run_in_subprocess

FULL = {
    "lengths": [512, 2048, 8192],
    "positions": [256, 1024, 4096, 16384],  # of --kinds generate
    "stream_lengths": [4096, 16384, 65536],
    "dim": 1536,
    "model_dim": 512,
    "repeats": 7,
}
QUICK = {
    "lengths": [1024],
    "positions": [256, 1024],
    "stream_lengths": [4096],
    "dim": 384,
    "model_dim": 128,
    "repeats": 3,
    "kinds": ["mixer", "model"],
}
SCALE = {  # --kinds scale (under torchrun)
    "models": ["tnn", "fd_tnn", "ski_tnn", "tcnca", "transformer"],
    "lengths": [16384, 32768, 65536],
    "model_dim": 256,
    "depth": 4,
    "repeats": 3,
}
CHECK_LENGTH = 8  # every case runs once at this length before anything is measured
KIND_LENGTHS = {"generate": "positions", "generate_mixer": "stream_lengths"}  # the argument holding a kind's lengths (else lengths)
KIND_LIMITS = {"generate": ("recompute_max",), "generate_mixer": ("direct_max_seconds",)}  # arguments a kind's cases carry


def add_bench(subparsers) -> None:
    parser = subparsers.add_parser("bench", help="time and memory of mixers, layers and models against the FFT floor")
    parser.add_argument(
        "--mixers",
        type=Names(list_mixers),
        default=None,
        help=f"comma-separated mixer names (default: all: {', '.join(list_mixers())}); the 2-D mixers lay each length on a "
        "near-square grid (a square one for square lengths: 1024 tokens as 32 x 32)",
    )
    parser.add_argument(
        "--models",
        type=Names(list_models),
        default=None,
        help="models whose layer and whole model are timed, and decoded by --kinds generate (default: all; generate: the causal LM ones)",
    )
    parser.add_argument(
        "--kinds",
        type=Names((*KINDS, "scale", "serve")),
        default=None,
        help="any of mixer,layer,model,generate,precision (default: mixer,layer,model; --quick: mixer,model); precision: each mixer "
        "under autocast to --precision against itself in float64 (relative errors of output and gradients, docs/training.md); "
        "generate: decoding by every "
        "causal LM model (depth 4, batch 1) at positions --lengths, cached step against recompute, and by every mixer "
        "that streams by its Toeplitz taps (tno, ski_tno, fd_tno; --mixers narrows them), token by token, tiled against the direct "
        "product; scale (alone, under torchrun): context parallelism's memory, step time and traffic per process for each of --processes "
        "(default models tnn,fd_tnn,ski_tnn,tcnca,transformer at 16384,32768,65536 tokens, width 256; docs/scale.md); "
        "serve (alone): `tokenmix serve` driven over HTTP by --concurrency streaming clients, against the model's own batched and "
        "one-at-a-time decoding (default models tnn,tcnca,mega,transformer at width 128, depth 4; docs/serve.md)",
    )
    parser.add_argument(
        "--processes", type=Lengths(), default=[1, 2, 4], help="--kinds scale: the context-parallel sizes measured (default: 1,2,4)"
    )
    parser.add_argument(
        "--depth",
        type=Integer(1),
        default=None,
        help="the models' depth (default: 2 for --kinds model, 4 for generate, scale and serve); layers are one block",
    )
    parser.add_argument(
        "--concurrency", type=Lengths("client counts"), default=None, help="--kinds serve: concurrent streaming clients (default 1,4,16,64)"
    )
    parser.add_argument(
        "--serve-requests", type=Integer(1), default=2, help="--kinds serve: requests each client sends, one after another (default: 2)"
    )
    parser.add_argument("--serve-tokens", type=Integer(1), default=128, help="--kinds serve: new tokens per request (default: 128)")
    parser.add_argument(
        "--server-cpus",
        type=Cpus(),
        default=None,
        help="--kinds serve (Linux): run the server and the in-process decoding it is compared with on these CPUs (e.g. 0,1) and the "
        "clients on the others, as clients on other machines would; the server then decodes with --threads threads "
        "(default: every process on every CPU, the server with one thread fewer than --threads)",
    )
    parser.add_argument(
        "--memory-budget",
        type=Number(0, open_minimum=True, optional=True),
        default=None,
        metavar="GIB",
        help="--kinds scale: also find, per process count, the longest length whose activations fit this many GiB per process",
    )
    parser.add_argument(
        "--lengths",
        type=Lengths(),
        default=None,
        help="sequence lengths (default: 512,2048,8192; --quick: 1024), and the positions of --kinds generate "
        "(default: 256,1024,4096,16384; --quick: 256,1024)",
    )
    parser.add_argument(
        "--stream-lengths",
        type=Lengths(),
        default=None,
        help="tokens the mixer decodes one by one in --kinds generate (default: 4096,16384,65536; --quick: 4096)",
    )
    parser.add_argument(
        "--recompute-max",
        type=Integer(1),
        default=8192,
        help="--kinds generate: recompute the whole prefix only at positions up to this (default: 8192); above it, skipped",
    )
    parser.add_argument(
        "--distilled",
        type=Lengths("orders"),
        default=[],
        metavar="ORDERS",
        help="--kinds generate: also decode each causal Toeplitz model with its Toeplitz mixers replaced by diagonal state spaces "
        "of these orders (`tokenmix distil`'s models; their rows say 'ssm N'), and the ssm mixer of each order beside the "
        "Toeplitz mixers, e.g. 16",
    )
    parser.add_argument(
        "--generate-batch",
        type=Integer(1),
        default=1,
        help="--kinds generate: sequences decoded at once (default: 1; the state grows with it)",
    )
    parser.add_argument(
        "--direct-max-seconds",
        type=Number(0, open_minimum=True),
        default=600.0,
        help="--kinds generate: stop the mixer's direct product after this many seconds and record how far it got (default: 600)",
    )
    parser.add_argument(
        "--dim",
        type=Integer(1),
        default=None,
        help="mixer channels, also of the mixer decoded by --kinds generate (default 1536, the GTU width of a 512-dim TNN; --quick: 384)",
    )
    parser.add_argument("--model-dim", type=Integer(1), default=None, help="width of the layers and models (default 512; --quick: 128)")
    parser.add_argument("--batch-tokens", type=Integer(1), default=4096, help="batch = max(1, batch_tokens // length) (default: 4096)")
    parser.add_argument("--causal", type=Choice(["both", "yes", "no"]), default="both", help="directions measured (default: both)")
    parser.add_argument("--dtype", type=Choice(sorted(DTYPES)), default="float32", help="dtype of modules and inputs (default: float32)")
    parser.add_argument("--device", type=DEVICE, default="cpu", help="auto (CUDA when available), cpu or cuda[:N] (default: cpu)")
    parser.add_argument(
        "--precision",
        type=Choice(list(PRECISIONS)),
        default="fp32",
        help="the forward under autocast to this compute dtype, parameters as --dtype (docs/training.md, mixed precision; default: fp32)",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile each mixer, layer and model's blocks (--kinds mixer, layer, model); the first calls compile, untimed",
    )
    parser.add_argument(
        "--compile-mode",
        type=Choice(list(COMPILE_MODES)),
        default="default",
        help="torch.compile's mode with --compile (reduce-overhead: CUDA graphs too) (default: default)",
    )
    parser.add_argument(
        "--repeats",
        type=Integer(1),
        default=None,
        help="timed repeats after 2 warm-up calls; the median is kept (default: 7; --quick, --kinds scale: 3; --kinds serve: "
        "rounds of clients and baselines after one warm-up round, default 3)",
    )
    parser.add_argument("--threads", type=Integer(1), default=torch.get_num_threads(), help="torch CPU threads (default: all cores)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a small run (about 100 s on 2 cores): every mixer and model at length 1024, dims 384/128, 3 repeats; explicit options win",
    )
    parser.add_argument(
        "-o",
        "--option",
        action="append",
        type=KeyValue("KEY=VALUE"),
        default=[],
        metavar="KEY=VALUE",
        help="an option for every benchmarked mixer (layer, model), e.g. -o path=sparse; NAME.KEY=VALUE for one name only",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also record the operators taking most of one training step (torch.profiler) per case of mixer, layer, model",
    )
    parser.add_argument(
        "--output",
        type=Output("a JSON file to write", folder=False),
        default=None,
        metavar="FILE.json",
        help="write the records as JSON, updated after every case",
    )
    parser.add_argument(
        "--plot", type=Output("a folder for the plots", folder=True), default=None, metavar="DIR", help="write PNG plots into DIR"
    )
    parser.add_argument(
        "--report",
        type=Output("a Markdown file to write", folder=False),
        default=None,
        metavar="FILE.md",
        help="write a Markdown report (tables, plots, reading)",
    )
    parser.set_defaults(handler=run_bench)


def apply_presets(args) -> None:
    """Fill the options the user left out from --quick's, the full run's or --kinds scale's presets."""
    preset = {**FULL, "kinds": list(TRAINING_KINDS), **(QUICK if args.quick else {})}
    for alone, presets in (("scale", SCALE), ("serve", SERVE)):
        if args.kinds and alone in args.kinds:
            if args.kinds != [alone]:
                raise ValueError(f"--kinds {alone} runs alone, not with {[kind for kind in args.kinds if kind != alone]}")
            preset = {**FULL, **presets}
    args.positions = args.lengths  # --lengths sets the positions of --kinds generate too
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)


def options_for(name: str, options: list[tuple[str, object]]) -> dict:
    """The options of one benchmarked name: KEY=VALUE apply to every name, NAME.KEY=VALUE to NAME only."""
    chosen = {}
    for key, value in options:
        scope, dot, option = key.rpartition(".")
        if not dot or scope == name:
            chosen[option] = value
    return chosen


def case_kinds(kinds: list[str]) -> list[str]:
    """The kinds of case --kinds asks for, in a fixed order (generate: the generate and generate_mixer cases)."""
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ValueError(f"kinds must be among {list(KINDS)}, got {unknown}")
    return [kind for kind in CASE_KINDS if kind in kinds or (kind == "generate_mixer" and "generate" in kinds)]


def bench_cases(args) -> list[Case]:
    args.mixers = args.mixers or list_mixers()
    args.models = args.models or list_models()
    causal_modes = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    kinds = case_kinds(args.kinds)
    benchmarked = {name for kind in kinds for name in (args.mixers if kind in MIXER_KINDS else args.models)}
    for key, _ in args.option:
        scope = key.rpartition(".")[0]
        if scope and scope not in benchmarked:
            raise ValueError(f"-o {key}: {scope!r} is not among the benchmarked names {sorted(benchmarked)}")
    cases = []
    for kind in kinds:
        names, dim = (args.mixers, args.dim) if kind in MIXER_KINDS else (args.models, args.model_dim)
        lengths = getattr(args, KIND_LENGTHS.get(kind, "lengths"))
        limits = {key: getattr(args, key) for key in KIND_LIMITS.get(kind, ())}
        for name in names:
            known = list_mixers() if kind in MIXER_KINDS else list_models()
            if name not in known:
                raise ValueError(f"{'mixer' if kind in MIXER_KINDS else 'model'} name must be one of {known}, got {name!r}")
            for causal in causal_modes:
                if not supports(kind, name, causal):
                    continue
                options = options_for(name, args.option)
                variants = [("", options)] + (distilled_variants(name, options, dim, args.distilled) if kind == "generate" else [])
                for length in lengths:
                    batch = case_batch(kind, length, args)
                    for variant, chosen in variants:
                        case = Case(kind, name, causal, length, dim, batch, args.dtype, args.device, chosen, limits, variant)
                        precision = "fp32" if kind == "generate_mixer" else args.precision  # a mixer decodes in its --dtype
                        compiled = args.compile and kind in TRAINING_KINDS
                        cases.append(replace(case, precision=precision, compile=compiled, compile_mode=args.compile_mode, depth=args.depth))
        if kind == "generate_mixer":  # the distilled models' mixer beside the Toeplitz ones, at the same width and lengths
            for order, length in ((order, length) for order in args.distilled for length in lengths):
                cases.append(Case(kind, "ssm", True, length, dim, 1, args.dtype, args.device, {"order": order}, limits, f"order {order}"))
    return cases


def case_batch(kind: str, length: int, args) -> int:
    """Sequences per case: --generate-batch for a model's decoding, one for a mixer's, else ``batch_for``."""
    if kind in GENERATE_KINDS:
        return args.generate_batch if kind == "generate" else 1
    return batch_for(length, args.batch_tokens)


def distilled_variants(name: str, options: dict, dim: int, orders: list[int]) -> list[tuple[str, dict]]:
    """(variant, options) of model ``name`` with its Toeplitz mixers replaced by ``ssm`` mixers of each order (none
    where it has no Toeplitz mixer): the shapes ``tokenmix distil`` gives it, with their initial modes."""
    if not orders:
        return []
    exact = resolve_model_options(name, options, dim, GENERATE_DEPTH)
    replaced = {order: distilled_options(exact, order) for order in orders}
    return [(f"ssm {order}", tree) for order, tree in replaced.items() if tree != exact]


def check_cases(cases: list[Case]) -> None:
    """Build and run every distinct case once at a tiny length, before any measurement: a bad option
    is a ValueError naming the case, not a failure discovered an hour into the run."""
    seen = set()
    for case in cases:
        key = (case.kind, case.label, case.causal, json.dumps(case.options, sort_keys=True))
        if key in seen:
            continue
        seen.add(key)
        tiny = replace(case, length=CHECK_LENGTH, batch=1, compile=False)
        try:
            if case.kind not in TRAINING_KINDS:
                measure(tiny, repeats=1)  # decoding: the prefill, steps and recompute (tiled and direct) of 8 tokens
            else:
                module, inputs = tiny.build()
                with torch.no_grad():
                    module(inputs)
        except (ValueError, TypeError) as error:
            raise ValueError(
                f"{case.kind} {case.label!r} ({'causal' if case.causal else 'bidirectional'}) with options {case.options}: {error}"
            ) from None


def run_bench(args) -> int:
    with user_input():
        apply_presets(args)
        if args.kinds == ["scale"]:
            return run_scale(args)
        if args.kinds == ["serve"]:
            return run_serve_bench(args)
        device = resolve_device(args.device)
        args.device = str(device)  # the cases (and their worker processes) get the resolved name, not "auto"
        cases = bench_cases(args)
        set_threads(args.threads)
        check_output_path(args.output, "--output")
        check_output_path(args.report, "--report")
        check_output_path(args.plot, "--plot", directory=True)
        check_cases(cases)
    in_process = device.type == "cuda"
    allocator = retain_freed_memory() if in_process else None
    revision = source_revision()
    records = []
    for case in progress_bar(cases, desc="bench", unit="case"):
        if in_process:
            try:
                measurement = measure(case, args.repeats, profile=args.profile)
            except RuntimeError as error:  # e.g. CUDA out of memory: keep the other cases
                measurement = failed_measurement(case, f"{type(error).__name__}: {error}")
            measurement.retain_freed_memory = allocator
        else:
            measurement = run_in_subprocess(case, args.repeats, args.threads, args.profile)
        measurement.git_commit = revision
        records.append(measurement.to_dict())
        if args.output:
            write_json_atomic(args.output, records)
    compiled = f", compiled ({args.compile_mode})" if args.compile else ""
    machine = (
        f"{platform.machine()}, {args.threads} threads, torch {torch.__version__}, {args.device}, {args.dtype}, {args.precision}{compiled}"
    )
    print(f"# {machine}; batch*length {args.batch_tokens}, median of {args.repeats}; source {revision or 'not a git checkout'}")
    print(bench_tables(records))
    failed = [record for record in records if record["error"]]
    plots = write_plots(records, args.plot) if args.plot else []
    if args.report:
        command = "tokenmix " + " ".join(shlex.quote(argument) for argument in args.argv)
        write_text_atomic(args.report, markdown_report(records, command, machine, plots, args.report))
    if failed:
        print(f"{len(failed)} of {len(records)} cases failed (see the error column)")
    return 1 if failed else 0


def run_scale(args) -> int:
    """``--kinds scale``: every process measures its part; the first writes and prints the records."""
    set_threads(args.threads)
    check_output_path(args.output, "--output")
    check_output_path(args.plot, "--plot", directory=True)
    context = init_distributed(resolve_device(args.device))

    def keep(records: list[dict]) -> None:
        if args.output and context.is_main:
            write_json_atomic(args.output, records)

    try:
        records = scale_records(args, source_revision(), keep)
        keep(records)
        if context.is_main:
            if args.plot:
                write_scale_plots(records, args.plot)
            print(f"# {platform.machine()}, {args.threads} threads per process, torch {torch.__version__}, {args.device}, {args.dtype}")
            print(scale_tables(records))
    finally:
        context.close()
    return 0


def run_serve_bench(args) -> int:
    """``--kinds serve``: the records of every model, written as they come; the tables and plot at the end."""
    from ..cli.serve import SERVE_EXTRA

    if importlib.util.find_spec("fastapi") is None or importlib.util.find_spec("httpx") is None:
        raise ValueError(SERVE_EXTRA.replace("tokenmix serve", "bench --kinds serve"))  # now, not mid-run
    check_output_path(args.output, "--output")
    check_output_path(args.plot, "--plot", directory=True)
    records = serve_records(args, source_revision(), lambda records: args.output and write_json_atomic(args.output, records))
    if args.output:
        write_json_atomic(args.output, records)
    if args.plot:
        write_serve_plots(records, args.plot)
    print(f"# {platform.machine()}, {args.threads} threads, torch {torch.__version__}, cpu, float32")
    print(bench_tables(records))
    return 0


def bench_tables(records: list[dict]) -> str:
    """The tables ``tokenmix bench`` prints for its records (those it writes with --output)."""
    if records and records[0].get("kind") in SCALE_KINDS:
        return scale_tables(records)
    if records and records[0].get("kind") in SERVE_KINDS:
        return serve_tables(records)
    return "\n\n".join(format_table(rows, table_columns(rows)) for rows in sections(records))


def add_compare(subparsers) -> None:
    parser = subparsers.add_parser("compare", help="compare two `tokenmix bench --output` JSON files (before, after)")
    parser.add_argument("before", type=Existing("a bench JSON file"), help="JSON of the earlier measurement")
    parser.add_argument("after", type=Existing("a bench JSON file"), help="JSON of the later measurement")
    parser.set_defaults(handler=run_compare)


def read_records(path: str) -> list[dict]:
    """The measurement records of a ``tokenmix bench --output`` file; ValueError for anything else."""
    try:
        records = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path!r} is not a readable bench JSON file: {error}") from None
    required = {"mixer", "causal", "length", "forward_ms", "forward_backward_ms"}  # "kind" came later: default "mixer"
    if isinstance(records, list):  # only the training kinds are compared (not decoding, not precision)
        records = [r for r in records if not (isinstance(r, dict) and r.get("kind") in CASE_KINDS and r["kind"] not in TRAINING_KINDS)]
    if not isinstance(records, list) or not records or not all(isinstance(r, dict) and required <= set(r) for r in records):
        raise ValueError(f"{path!r} is not a `tokenmix bench --output` file: expected a list of records with {sorted(required)}")
    for number, record in enumerate(records):
        problem = _record_problem(record)
        if problem:
            raise ValueError(f"{path!r}: record {number} ({record.get('mixer')!r:.40} at length {record.get('length')!r:.20}) {problem}")
    return records


SETTING_KINDS = {"dim": int, "batch": int, "threads": int, "retain_freed_memory": bool}  # the others are strings


def _record_problem(record: dict) -> str | None:
    """What is wrong with a bench record's identity, settings or times (None: nothing)."""
    integer = lambda value: isinstance(value, int) and not isinstance(value, bool) and value > 0  # noqa: E731
    if not isinstance(record.get("kind", "mixer"), str) or not isinstance(record["mixer"], str):
        return "has a kind or name that is not a string"
    if not isinstance(record["causal"], bool) or not integer(record["length"]):
        return "must have a causal flag (true or false) and a length > 0"
    for key in (*COMPARED_SETTINGS, *CONDITIONS):
        kind = SETTING_KINDS.get(key, str)
        if record.get(key) is not None and not (isinstance(record[key], kind) and (kind is bool or not isinstance(record[key], bool))):
            return f"has {key} {record[key]!r:.30}, not a {kind.__name__}"
    if record.get("error") is not None and not isinstance(record["error"], str):
        return "has an error that is not a string"
    times = [record[field] for field in ("forward_ms", "forward_backward_ms")]
    positive = lambda time: isinstance(time, (int, float)) and not isinstance(time, bool) and 0 < time < math.inf  # noqa: E731
    if not record.get("error") and not all(map(positive, times)):
        return f"has times {times}, not positive numbers"
    return None


def comparison_table(before_path: str, after_path: str) -> str:
    """What ``tokenmix compare`` prints: the speed-ups of the cases two bench files share."""
    before, after = read_records(before_path), read_records(after_path)
    rows = comparison_rows(before, after)
    if not rows:
        raise ValueError(
            "the two files share no comparable case: the same kind, name, direction and length, measured at the same "
            "dim, batch, dtype and device"
        )
    for line in condition_differences(before, after):
        warnings.warn(f"{line}: the speed-ups mix this change with the code's", stacklevel=2)
    return format_table(rows, list(rows[0]))


def run_compare(args) -> int:
    with user_input():
        print(comparison_table(args.before, args.after))
    return 0
