"""``tokenmix bench``: speed and memory of mixers, layers and models, decoding speed, with plots and a report.

The arguments are in ``bench_arguments``; the cases, their measurement and the tables in ``tokenmix.bench``.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import shlex

import numpy as np
import torch

from ..bench.data import check_data_arguments, data_records
from ..bench.pathfinder import pathfinder_records, write_pathfinder_plot
from ..bench.plan import apply_presets, bench_cases, check_cases
from ..bench.report import markdown_report, write_plots
from ..bench.run import bench_tables, measure_cases
from ..bench.scale import scale_records, write_scale_plots
from ..bench.serve import serve_records, write_serve_plots
from ..devices import resolve_device
from ..errors import user_input
from ..io.files import write_json_atomic, write_text_atomic
from ..parallel.dims import init_distributed
from ..runtime import set_threads
from ..version import source_revision
from .arguments import check_output_path
from .bench_arguments import add_bench_arguments
from .serve import SERVE_EXTRA


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("bench", help="time and memory of mixers, layers and models against the FFT floor")
    add_bench_arguments(parser)
    parser.set_defaults(handler=run_bench)


def run_bench(args) -> int:
    with user_input():
        apply_presets(args)
        check_output_path(args.data_dir, "--data-dir", directory=True)
        if args.kinds == ["data"]:
            check_output_path(args.output, "--output")
            check_data_arguments(args)
            return run_data_bench(args)
        if args.kinds == ["pathfinder"]:
            check_output_path(args.output, "--output")
            check_output_path(args.plot, "--plot", directory=True)
            return run_pathfinder_bench(args)
        if args.kinds == ["scale"]:
            return run_scale(args)
        if args.kinds == ["serve"]:
            return run_serve_bench(args)
        args.device = str(resolve_device(args.device))  # the cases (and their worker processes) get the resolved name, not "auto"
        cases = bench_cases(args)
        set_threads(args.threads)
        check_output_path(args.output, "--output")
        check_output_path(args.report, "--report")
        check_output_path(args.plot, "--plot", directory=True)
        check_cases(cases)
    revision = source_revision()
    records = measure_cases(cases, args.repeats, args.threads, args.profile, revision, keep=lambda records: write_output(args, records))
    compiled = f", compiled ({args.compile_mode})" if args.compile else ""
    settings = f"{args.device}, {args.dtype}, {args.precision}{compiled}, {args.kernels} kernels"
    machine = f"{platform.machine()}, {args.threads} threads, torch {torch.__version__}, {settings}"
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


def write_output(args, records: list[dict]) -> None:
    """``--output``: the records so far, rewritten after every case."""
    if args.output:
        write_json_atomic(args.output, records)


def run_scale(args) -> int:
    """``--kinds scale``: every process measures its part; the first writes and prints the records."""
    set_threads(args.threads)
    check_output_path(args.output, "--output")
    check_output_path(args.plot, "--plot", directory=True)
    dims = init_distributed(resolve_device(args.device))

    def keep(records: list[dict]) -> None:
        if dims.is_main:
            write_output(args, records)

    try:
        records = scale_records(args, source_revision(), keep)
        keep(records)
        if dims.is_main:
            if args.plot:
                write_scale_plots(records, args.plot)
            print(f"# {platform.machine()}, {args.threads} threads per process, torch {torch.__version__}, {args.device}, {args.dtype}")
            print(bench_tables(records))
    finally:
        dims.close()
    return 0


def run_serve_bench(args) -> int:
    """``--kinds serve``: the records of every model, written as they come; the tables and plot at the end."""
    if importlib.util.find_spec("fastapi") is None or importlib.util.find_spec("httpx") is None:
        raise ValueError(SERVE_EXTRA.replace("tokenmix serve", "bench --kinds serve"))  # now, not mid-run
    check_output_path(args.output, "--output")
    check_output_path(args.plot, "--plot", directory=True)
    records = serve_records(args, source_revision(), lambda records: write_output(args, records))
    write_output(args, records)
    if args.plot:
        write_serve_plots(records, args.plot)
    print(f"# {platform.machine()}, {args.threads} threads, torch {torch.__version__}, cpu, float32")
    print(bench_tables(records))
    return 0


def run_data_bench(args) -> int:
    """``--kinds data``: the records written as they come, the tables at the end."""
    set_threads(args.threads)
    records = data_records(args, source_revision(), lambda records: write_output(args, records))
    write_output(args, records)
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    print(f"# {platform.machine()}, {args.threads} threads, torch {torch.__version__}, {args.device}, float32; load average {load}")
    print(bench_tables(records))
    return 0


def run_pathfinder_bench(args) -> int:
    """``--kinds pathfinder``: the records written as they come, the table and the examples' plot at the end."""
    set_threads(args.threads)
    records, examples = pathfinder_records(args, source_revision(), lambda records: write_output(args, records))
    write_output(args, records)
    if args.plot:
        write_pathfinder_plot(examples, args.plot)
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    print(f"# {platform.machine()}, one process, numpy {np.__version__}; load average {load}")
    print(bench_tables(records))
    return 0
