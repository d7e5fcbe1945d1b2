"""``tokenmix prepare``: a corpus (text, jsonl, parquet, compressed, a ``datasets`` folder) as token shards that
``--data DIR`` reads in place (``tokenmix.data.prepare``)."""

from __future__ import annotations

import os

from ..errors import user_input
from ..fields import Choice, Integer, Number, Output, Text
from ..train.config import TOKENIZER
from .arguments import check_output_path

DEFAULT_WORKERS = min(4, os.cpu_count() or 1)


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "prepare",
        help="tokenize a corpus into token shards on disk, which train / eval / finetune / distil read with --data DIR",
        description="Reads text files (.txt .md), jsonl, parquet (each also .gz or .zst but parquet), a folder of them, a folder "
        "saved by the datasets library, or hf:NAME; writes DIR/manifest.json, DIR/tokenizer.json and DIR/{split}-NNNNN.bin/.idx "
        "(docs/data.md). Run again after an interruption, it continues after its last finished chunk.",
    )
    parser.add_argument("sources", nargs="+", type=Text("a file, a folder or hf:NAME"), help="files, folders or hf:NAME")
    parser.add_argument("--out", required=True, type=Output("a folder for the prepared data", folder=True), help="the folder to write")
    parser.add_argument(
        "--tokenizer",
        type=TOKENIZER,
        default="bytes",
        help="bytes (default), a tokenizer.json file or bpe:VOCAB (a byte-level BPE learnt from --bpe-sample-mb of training text)",
    )
    parser.add_argument(
        "--bpe-sample-mb", type=Number(0, open_minimum=True), default=64.0, help="text a bpe:VOCAB tokenizer learns from (default: 64)"
    )
    parser.add_argument(
        "--field", type=Text("a column name"), default="text", help="jsonl / parquet / datasets: the text's field (default: text)"
    )
    parser.add_argument(
        "--text-unit",
        type=Choice(["file", "paragraph", "line"]),
        default="file",
        help="text files: one document per file (default), per paragraph (split at blank lines) or per line",
    )
    parser.add_argument(
        "--val-fraction", type=Number(0, 1, open_maximum=True), default=0.05, help="share of documents for val (default: 0.05)"
    )
    parser.add_argument(
        "--test-fraction", type=Number(0, 1, open_maximum=True), default=0.05, help="share of documents for test (default: 0.05)"
    )
    parser.add_argument("--chunk-mb", type=Number(0, open_minimum=True), default=64.0, help="text per shard, in MiB (default: 64)")
    parser.add_argument(
        "--workers",
        type=Integer(1),
        default=DEFAULT_WORKERS,
        help=f"processes that tokenize (default: {DEFAULT_WORKERS}, up to 4 of the CPUs)",
    )
    parser.add_argument("--skip-bad", action="store_true", help="skip bad records (a jsonl line that is not JSON ...), counting them")
    parser.set_defaults(handler=run_prepare)


def run_prepare(args) -> int:
    from ..data.prepare import PrepareOptions, prepare, summary, tokenizer_for

    with user_input():
        check_output_path(args.out, "--out", directory=True)
        options = PrepareOptions(args.field, args.text_unit, args.val_fraction, args.test_fraction, args.chunk_mb)
        tokenizer = tokenizer_for(args.tokenizer, args.sources, options, int(args.bpe_sample_mb * (1 << 20)), args.out, progress=True)
        manifest = prepare(
            args.sources,
            tokenizer,
            args.out,
            options,
            workers=args.workers,
            skip_bad=args.skip_bad,
            progress=True,
            tokenizer_spec=args.tokenizer,
        )
    print(f"prepared {args.out} ({tokenizer.name}, {manifest['dtype']}):\n{summary(manifest)}")
    return 0
