"""``tokenmix distil``: a run whose causal Toeplitz mixers become diagonal state spaces (constant-memory decoding).

With ``--max-loss-increase`` it sweeps orders: each distilled model's validation loss beside the exact
model's, a plot of kernel error and loss against order, and the smallest order within the budget written.
"""

from __future__ import annotations

from pathlib import Path

from ..data.tokenizer import TOKENIZER_FILE
from ..errors import user_input
from ..fields import Integer, Output
from ..io.files import write_json_atomic
from ..io.table import format_table
from ..models.distil import SWEEP_ORDERS, distilled_model, fit_orders, recommended_order, sweep_orders
from ..models.saving import save_pretrained
from ..runs import open_run
from ..runs.checkpoint import load_checkpoint, save_checkpoint
from ..runs.layout import CHECKPOINT_FILE, MODEL_DIRECTORY
from ..train.directory import check_directory, claim_directory
from ..train.evaluate import EVAL_BATCH
from ..train.lock import RunLock
from ..version import __version__, source_revision
from .arguments import Lengths, Percent, check_output_path
from .common import RUN, add_threads_and_device, use_threads
from .evaluate import run_objective

REPORT_FILE = "distil.json"
SWEEP_PLOT = "distil_sweep.png"
COLUMNS = ["mixer", "relative_l2", "median_relative_l2", "relative_linf", "bound_vs_l2", "bound_vs_l1"]
SWEEP_COLUMNS = ["order", "loss", "loss_increase", "relative_l2", "relative_linf", "bound_vs_l1", "state_bytes"]


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "distil", help="replace a run's causal Toeplitz mixers by fitted state spaces: constant-memory decoding (docs/inference.md)"
    )
    parser.add_argument("run", type=RUN, help="checkpoint.pt or its run directory (tno, fd_tno or causal ski_tno mixers)")
    parser.add_argument(
        "--order",
        type=Lengths("orders"),
        default=None,
        help="complex modes per channel (the state: this many per channel); with --max-loss-increase, the orders to try "
        f"(default {','.join(map(str, SWEEP_ORDERS))})",
    )
    parser.add_argument(
        "--max-loss-increase",
        type=Percent(),
        default=None,
        help="sweep the orders, evaluate each on the validation split and write the smallest whose loss exceeds the exact "
        "model's by at most this, in percent (e.g. 0.5%%)",
    )
    parser.add_argument(
        "--eval-tokens", type=Integer(1), default=None, help="--max-loss-increase: validation tokens each evaluation reads (default: all)"
    )
    parser.add_argument("--window", type=Integer(0), default=0, help="first lags kept exactly as a short convolution (default 0)")
    parser.add_argument("--horizon", type=Integer(2), default=None, help="lags the fit covers (default: the run's training --seq-len)")
    parser.add_argument(
        "--out", type=Output("a folder for the distilled run", folder=True), required=True, help="the run directory to write"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace a run already in --out")
    parser.add_argument(
        "--json", type=Output("a JSON file to write", folder=False), default=None, metavar="FILE", help=f"also write {REPORT_FILE} here"
    )
    parser.add_argument(
        "--plot",
        type=Output("a PNG file to write", folder=False),
        default=None,
        metavar="FILE",
        help=f"--max-loss-increase: the sweep's picture (default: {SWEEP_PLOT} in --out)",
    )
    add_threads_and_device(parser)
    parser.set_defaults(handler=run_distil)


def _orders(args) -> list[int]:
    """The orders to fit: the one given, or with a budget the candidates (ValueError where they do not fit the flags)."""
    if args.window >= args.horizon:
        raise ValueError(f"--window {args.window} must be below --horizon {args.horizon}: the modes fit the lags past the window")
    if args.max_loss_increase is None:
        if args.order is None or len(args.order) != 1:
            raise ValueError("--order: give one order (e.g. --order 16), or several with --max-loss-increase to pick among them")
        return args.order
    if args.order is not None:
        return sorted(set(args.order))
    return [order for order in SWEEP_ORDERS if order <= args.horizon - args.window] or [args.horizon - args.window]


def run_distil(args) -> int:
    with user_input():
        use_threads(args)
        check_output_path(args.out, "--out", directory=True)
        check_output_path(args.json, "--json")
        check_output_path(args.plot, "--plot")
        for flag, value in (("--plot", args.plot), ("--eval-tokens", args.eval_tokens)):
            if value is not None and args.max_loss_increase is None:
                raise ValueError(f"{flag} belongs to a sweep: give --max-loss-increase with it")
        out = Path(args.out)
        lock = RunLock(out, "distil")  # one writer per run directory
    with lock:
        return _distil(args, out)


def _distil(args, out: Path) -> int:
    with user_input():
        check_directory(out, args.overwrite)  # before the fit, which takes a while
        source = load_checkpoint(args.run)
        run = open_run(args.run, device=args.device)
        model, train_config, tokenizer = run.model, run.training_settings("distil"), run.tokenizer
        args.horizon = args.horizon or train_config["seq_len"]
        orders = _orders(args)
        settings = {"source": str(args.run), "window": args.window, "horizon": args.horizon}
        if args.max_loss_increase is None:
            order, sweep = orders[0], None
            fits = fit_orders(model, orders, args.window, args.horizon, progress=True)[order]
        else:
            objective = run_objective(model, train_config, tokenizer, train_config["seq_len"])
            batch_size = min(EVAL_BATCH, train_config["batch_size"])

            def loss_of(candidate) -> float:
                length = train_config["seq_len"]
                return objective.evaluate(candidate, "val", length=length, max_tokens=args.eval_tokens, batch_size=batch_size)["loss"]

            sweep, all_fits = sweep_orders(model, orders, loss_of, args.window, args.horizon, progress=True)
            try:
                order = recommended_order(sweep, args.max_loss_increase)
            except ValueError:  # what the sweep found is kept beside the refusal
                print(sweep_table(sweep))
                if args.json is not None:
                    write_json_atomic(args.json, {**settings, "max_loss_increase": args.max_loss_increase, "sweep": sweep})
                if args.plot is not None:
                    _plot(sweep, args, args.plot)
                raise
            fits = all_fits[order]
            settings = {**settings, "max_loss_increase": args.max_loss_increase, "eval_tokens": args.eval_tokens, "sweep": sweep}
        distilled = distilled_model(model, order, args.window, fits)
        claim_directory(out, args.overwrite)
    settings = {**settings, "order": order}
    state = {key: source[key] for key in ("train_config", "step", "tokenizer", "data_files") if key in source}
    save_checkpoint(
        out / CHECKPOINT_FILE, {**state, "model_config": distilled.config.to_dict(), "model": distilled.state_dict(), "distilled": settings}
    )
    save_pretrained(distilled, out / MODEL_DIRECTORY)
    if tokenizer is not None:
        tokenizer.save(out / TOKENIZER_FILE)
        tokenizer.save(out / MODEL_DIRECTORY / TOKENIZER_FILE)
    report = {**settings, "layers": [fit.report for fit in fits], "tokenmix_version": __version__, "git_commit": source_revision()}
    for file in (out / REPORT_FILE, args.json):
        if file is not None:
            write_json_atomic(file, report)
    print(distil_report(report))
    if sweep is not None:
        print(f"the sweep: {_plot(sweep, args, args.plot or out / SWEEP_PLOT)}")
    print(f"wrote {out}: compare with `tokenmix eval {args.run} {out} --split val`")
    return 0


def _plot(sweep: list[dict], args, path) -> Path:
    from .plots import plot_distil_sweep

    return plot_distil_sweep(sweep, args.max_loss_increase, path, title=f"{args.run}: distilled at each order")


def distil_report(report: dict) -> str:
    """What ``tokenmix distil`` prints for its report: the sweep (if any) and its choice, then the written order's layers."""
    parts = []
    if "sweep" in report:
        choice = f"order {report['order']}: the smallest within --max-loss-increase {report['max_loss_increase']:.4%}"
        parts = [sweep_table(report["sweep"]), choice]
    layers = f"order {report['order']}, window {report['window']}, horizon {report['horizon']}, each mixer's kernel fit:"
    return "\n".join([*parts, layers, format_table(report["layers"], COLUMNS)])


def sweep_table(sweep: list[dict]) -> str:
    """A sweep's rows: each order's validation loss, its increase over the exact model's, the largest kernel errors."""
    return format_table([{**row, "loss_increase": f"{row['loss_increase']:+.4%}"} for row in sweep], SWEEP_COLUMNS)
