"""``tokenmix distil``: a run whose causal Toeplitz mixers become diagonal state spaces (constant-memory decoding)."""

from __future__ import annotations

from pathlib import Path

from ..data.tokenizer import TOKENIZER_FILE
from ..errors import user_input
from ..fields import Integer, Output, check_output_path
from ..files import write_json_atomic
from ..models.distil import distil
from ..models.saving import save_pretrained
from ..table import format_table
from ..train.checkpoint import CHECKPOINT_FILE, load_checkpoint, model_from_checkpoint, save_checkpoint
from ..train.runs import MODEL_DIRECTORY, check_directory, claim_directory
from .common import RUN, add_threads_and_device, use_threads

REPORT_FILE = "distil.json"
COLUMNS = ["mixer", "relative_l2", "median_relative_l2", "relative_linf", "bound_vs_l2", "bound_vs_l1"]


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "distil", help="replace a run's causal Toeplitz mixers by fitted state spaces: constant-memory decoding (docs/inference.md)"
    )
    parser.add_argument("run", type=RUN, help="checkpoint.pt or its run directory (tno, fd_tno or causal ski_tno mixers)")
    parser.add_argument("--order", type=Integer(1), required=True, help="complex modes per channel (the state: this many per channel)")
    parser.add_argument("--window", type=Integer(0), default=0, help="first lags kept exactly as a short convolution (default 0)")
    parser.add_argument("--horizon", type=Integer(2), default=None, help="lags the fit covers (default: the run's training --seq-len)")
    parser.add_argument(
        "--out", type=Output("a folder for the distilled run", folder=True), required=True, help="the run directory to write"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace a run already in --out")
    add_threads_and_device(parser)
    parser.set_defaults(handler=run_distil)


def run_distil(args) -> int:
    with user_input():
        use_threads(args)
        check_output_path(args.out, "--out", directory=True)
        out = Path(args.out)
        check_directory(out, args.overwrite)  # before the fit, which takes a while
        source = load_checkpoint(args.run)
        model, train_config, tokenizer = model_from_checkpoint(args.run, args.device)
        args.horizon = args.horizon or train_config["seq_len"]
        distilled, reports = distil(model, args.order, args.window, args.horizon, progress=True)
        claim_directory(out, args.overwrite)
    settings = {"source": str(args.run), "order": args.order, "window": args.window, "horizon": args.horizon}
    state = {key: source[key] for key in ("train_config", "step", "tokenizer", "data_files") if key in source}
    save_checkpoint(
        out / CHECKPOINT_FILE, {**state, "model_config": distilled.config.to_dict(), "model": distilled.state_dict(), "distilled": settings}
    )
    save_pretrained(distilled, out / MODEL_DIRECTORY)
    if tokenizer is not None:
        tokenizer.save(out / TOKENIZER_FILE)
        tokenizer.save(out / MODEL_DIRECTORY / TOKENIZER_FILE)
    write_json_atomic(out / REPORT_FILE, {**settings, "layers": reports})
    print(format_table(reports, COLUMNS))
    print(f"wrote {out}: compare with `tokenmix eval {args.run} {out} --split val`")
    return 0
