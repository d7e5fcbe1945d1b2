"""``tokenmix bench``: mixer speed against the FFT floor, as a table and JSON."""

from __future__ import annotations

import json

import torch
from tqdm.auto import tqdm

from ..cli_args import parse_lengths, parse_names
from ..table import format_table
from .mixers import describe_machine, measure_mixer

TABLE_COLUMNS = [
    "mixer",
    "causal",
    "length",
    "batch",
    "forward_ms",
    "forward_backward_ms",
    "fft_floor_ms",
    "fwd_ratio_to_fft",
    "fwdbwd_ratio_to_fft",
]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def add_bench(subparsers) -> None:
    parser = subparsers.add_parser("bench", help="time mixers (eval forward, train forward+backward) against the FFT floor")
    parser.add_argument("--mixers", type=parse_names, default=["tno"], help="comma-separated mixer names (default: tno)")
    parser.add_argument("--lengths", type=parse_lengths, default=[512, 2048, 8192])
    parser.add_argument("--dim", type=int, default=1536, help="channels (default 1536: a TNN GTU of width 3 x 512)")
    parser.add_argument("--batch-tokens", type=int, default=4096, help="batch = max(1, batch_tokens // length)")
    parser.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="small subset: lengths 512,2048, dim 512")
    parser.add_argument("--output", default=None, metavar="FILE.json", help="write one JSON record per measurement")
    parser.set_defaults(handler=run_bench)


def run_bench(args) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.lengths, args.dim, args.repeats = [512, 2048], 512, 3
    causal_modes = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    jobs = [(name, causal, length) for name in args.mixers for causal in causal_modes for length in args.lengths]
    records = []
    for name, causal, length in tqdm(jobs, desc="bench", unit="case"):
        records.append(
            measure_mixer(
                name,
                length,
                dim=args.dim,
                batch_tokens=args.batch_tokens,
                causal=causal,
                dtype=DTYPES[args.dtype],
                device=args.device,
                repeats=args.repeats,
            )
        )
    print(f"# {describe_machine()}; dim {args.dim}, batch*length {args.batch_tokens}, {args.dtype}, median of {args.repeats}")
    print(format_table([r.to_dict() for r in records], TABLE_COLUMNS))
    if args.output:
        with open(args.output, "w") as handle:
            json.dump([r.to_dict() for r in records], handle, indent=2)
    return 0
