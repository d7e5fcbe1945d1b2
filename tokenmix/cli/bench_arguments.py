"""The arguments of ``tokenmix bench``, in groups: what is measured, its sizes, how it runs, the options of
the kinds generate, scale, serve, data and pathfinder, and the outputs."""

from __future__ import annotations

import torch

from ..bench.cases import DTYPES, KINDS
from ..compilation import COMPILE_MODES
from ..data.pathfinder_gen import DIFFICULTIES, RESOLUTIONS
from ..data.tokenizer import Tokenizer, parse_tokenizer_spec
from ..fields import Choice, Integer, Names, Number, Output, Parsed
from ..mixers.registry import list_mixers
from ..models.registry import list_models
from ..precision import PRECISIONS
from ..train.config import DEVICE
from .arguments import Cpus, KeyValue, Lengths, LengthsAmong, Sizes
from .common import add_kernels


def read_tokenizer_spec(spec: str) -> None:
    """bytes, bpe:V, or a tokenizer.json file, read now (ValueError when it is not one)."""
    kind, path = parse_tokenizer_spec(spec)
    if kind == "file":
        Tokenizer.load(path)


TOKENIZER = Parsed("bytes, bpe:VOCAB or a tokenizer.json file", read_tokenizer_spec, ["bpe:1", "bpe:x", "/no/such/tokenizer.json"])


def add_bench_arguments(parser) -> None:
    for add in (add_selection, add_sizes, add_execution, add_generate, add_scale, add_serve, add_data, add_pathfinder, add_outputs):
        add(parser)


def add_selection(parser) -> None:
    """The mixers, models and kinds of measurement, and the options of what they build."""
    group = parser.add_argument_group("what is measured")
    group.add_argument(
        "--mixers",
        type=Names(list_mixers),
        default=None,
        help=f"comma-separated mixer names (default: all: {', '.join(list_mixers())}); the 2-D mixers lay each length on a "
        "near-square grid (a square one for square lengths: 1024 tokens as 32 x 32)",
    )
    group.add_argument(
        "--models",
        type=Names(list_models),
        default=None,
        help="models whose layer and whole model are timed, and decoded by --kinds generate (default: all; generate: the causal LM ones)",
    )
    group.add_argument(
        "--kinds",
        type=Names((*KINDS, "scale", "serve", "data", "pathfinder")),
        default=None,
        help="any of mixer,layer,model,generate,precision (default: mixer,layer,model; --quick: mixer,model); precision: each mixer "
        "under autocast to --precision against itself in float64 (relative errors of output and gradients, docs/training.md); "
        "generate: decoding by every "
        "causal LM model (depth 4, batch 1) at positions --lengths, cached step against recompute, and by every mixer "
        "that streams by its Toeplitz taps (tno, ski_tno, fd_tno; --mixers narrows them), token by token, tiled against the direct "
        "product; scale (alone, under torchrun): context parallelism's memory, step time and traffic per process for each of --processes "
        "(default models tnn,fd_tnn,ski_tnn,tcnca,transformer at 16384,32768,65536 tokens, width 256; docs/scale.md); "
        "serve (alone): `tokenmix serve` driven over HTTP by --concurrency streaming clients, against the model's own batched and "
        "one-at-a-time decoding (default models tnn,tcnca,mega,transformer at width 128, depth 4; docs/serve.md); "
        "data (alone): tokenmix prepare's throughput against the tokenizers library's own, a training step's time drawing its batch "
        "from token shards, and the peak memory of tokenmix train over corpora of --data-gb sizes (default model: the Quickstart's "
        "tnn, width 128, depth 4, 16 x 512 tokens); pathfinder (alone): how fast pathfinder-gen draws its images at each "
        "--pathfinder-resolutions, its cache written and read back, and the images' ink, label balance and distractors",
    )
    group.add_argument("--causal", type=Choice(["both", "yes", "no"]), default="both", help="directions measured (default: both)")
    group.add_argument(
        "-o",
        "--option",
        action="append",
        type=KeyValue("KEY=VALUE"),
        default=[],
        metavar="KEY=VALUE",
        help="an option for every benchmarked mixer (layer, model), e.g. -o path=sparse; NAME.KEY=VALUE for one name only",
    )
    group.add_argument(
        "--quick",
        action="store_true",
        help="a small run (about 100 s on 2 cores): every mixer and model at length 1024, dims 384/128, 3 repeats; explicit options win",
    )


def add_sizes(parser) -> None:
    """The lengths, widths, depth and batch of the cases, and the timed repeats."""
    group = parser.add_argument_group("sizes and repeats")
    group.add_argument(
        "--lengths",
        type=Lengths(),
        default=None,
        help="sequence lengths (default: 512,2048,8192; --quick: 1024), and the positions of --kinds generate "
        "(default: 256,1024,4096,16384; --quick: 256,1024)",
    )
    group.add_argument(
        "--dim",
        type=Integer(1),
        default=None,
        help="mixer channels, also of the mixer decoded by --kinds generate (default 1536, the GTU width of a 512-dim TNN; --quick: 384)",
    )
    group.add_argument("--model-dim", type=Integer(1), default=None, help="width of the layers and models (default 512; --quick: 128)")
    group.add_argument(
        "--depth",
        type=Integer(1),
        default=None,
        help="the models' depth (default: 2 for --kinds model, 4 for generate, scale and serve); layers are one block",
    )
    group.add_argument(
        "--batch-tokens",
        type=Integer(1),
        default=None,
        help="batch = max(1, batch_tokens // length) (default: 4096; --kinds data: 8192, the Quickstart's 16 x 512)",
    )
    group.add_argument(
        "--repeats",
        type=Integer(1),
        default=None,
        help="timed repeats after 2 warm-up calls; the median is kept (default: 7; --quick, --kinds scale: 3; --kinds serve: "
        "rounds of clients and baselines after one warm-up round, default 3; --kinds data: runs of each way of tokenizing, default 3)",
    )


def add_execution(parser) -> None:
    """Where and how the cases run: dtype, device, autocast, compilation, threads, profiling."""
    group = parser.add_argument_group("how it runs")
    group.add_argument("--dtype", type=Choice(sorted(DTYPES)), default="float32", help="dtype of modules and inputs (default: float32)")
    group.add_argument("--device", type=DEVICE, default="cpu", help="auto (CUDA when available), cpu or cuda[:N] (default: cpu)")
    group.add_argument(
        "--precision",
        type=Choice(list(PRECISIONS)),
        default="fp32",
        help="the forward under autocast to this compute dtype, parameters as --dtype (docs/training.md, mixed precision; default: fp32)",
    )
    group.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile each mixer, layer and model's blocks (--kinds mixer, layer, model); the first calls compile, untimed",
    )
    group.add_argument(
        "--compile-mode",
        type=Choice(list(COMPILE_MODES)),
        default="default",
        help="torch.compile's mode with --compile (reduce-overhead: CUDA graphs too) (default: default)",
    )
    add_kernels(group)
    group.add_argument("--threads", type=Integer(1), default=torch.get_num_threads(), help="torch CPU threads (default: all cores)")
    group.add_argument(
        "--profile",
        action="store_true",
        help="also record the operators taking most of one training step (torch.profiler) per case of mixer, layer, model",
    )


def add_generate(parser) -> None:
    """The decoding measured by --kinds generate."""
    group = parser.add_argument_group("--kinds generate")
    group.add_argument(
        "--stream-lengths",
        type=Lengths(),
        default=None,
        help="tokens the mixer decodes one by one in --kinds generate (default: 4096,16384,65536; --quick: 4096)",
    )
    group.add_argument(
        "--recompute-max",
        type=Integer(1),
        default=8192,
        help="--kinds generate: recompute the whole prefix only at positions up to this (default: 8192); above it, skipped",
    )
    group.add_argument(
        "--distilled",
        type=Lengths("orders"),
        default=[],
        metavar="ORDERS",
        help="--kinds generate: also decode each causal Toeplitz model with its Toeplitz mixers replaced by diagonal state spaces "
        "of these orders (`tokenmix distil`'s models; their rows say 'ssm N'), and the ssm mixer of each order beside the "
        "Toeplitz mixers, e.g. 16",
    )
    group.add_argument(
        "--generate-batch",
        type=Integer(1),
        default=1,
        help="--kinds generate: sequences decoded at once (default: 1; the state grows with it)",
    )
    group.add_argument(
        "--direct-max-seconds",
        type=Number(0, open_minimum=True),
        default=600.0,
        help="--kinds generate: stop the mixer's direct product after this many seconds and record how far it got (default: 600)",
    )


def add_scale(parser) -> None:
    """Context parallelism's measurement, --kinds scale."""
    group = parser.add_argument_group("--kinds scale (under torchrun)")
    group.add_argument(
        "--processes", type=Lengths(), default=[1, 2, 4], help="--kinds scale: the context-parallel sizes measured (default: 1,2,4)"
    )
    group.add_argument(
        "--memory-budget",
        type=Number(0, open_minimum=True, optional=True),
        default=None,
        metavar="GIB",
        help="--kinds scale: also find, per process count, the longest length whose activations fit this many GiB per process",
    )


def add_serve(parser) -> None:
    """The server driven over HTTP by --kinds serve."""
    group = parser.add_argument_group("--kinds serve")
    group.add_argument(
        "--concurrency", type=Lengths("client counts"), default=None, help="--kinds serve: concurrent streaming clients (default 1,4,16,64)"
    )
    group.add_argument(
        "--serve-requests", type=Integer(1), default=2, help="--kinds serve: requests each client sends, one after another (default: 2)"
    )
    group.add_argument("--serve-tokens", type=Integer(1), default=128, help="--kinds serve: new tokens per request (default: 128)")
    group.add_argument(
        "--server-cpus",
        type=Cpus(),
        default=None,
        help="--kinds serve (Linux): run the server and the in-process decoding it is compared with on these CPUs (e.g. 0,1) and the "
        "clients on the others, as clients on other machines would; the server then decodes with --threads threads "
        "(default: every process on every CPU, the server with one thread fewer than --threads)",
    )


def add_data(parser) -> None:
    """Preparing and reading token shards, --kinds data."""
    group = parser.add_argument_group("--kinds data")
    group.add_argument(
        "--data-mb",
        type=Number(0, open_minimum=True),
        default=64.0,
        help="--kinds data: MiB of generated text tokenized by the tokenizers library alone and by tokenmix prepare (default: 64)",
    )
    group.add_argument(
        "--tokenizer",
        type=TOKENIZER,
        default="bpe:4096",
        help="--kinds data: that text's tokenizer: bpe:VOCAB (learnt from its first MiB), bytes or a tokenizer.json (default: bpe:4096)",
    )
    group.add_argument(
        "--data-steps",
        type=Integer(1),
        default=50,
        help="--kinds data: training steps timed, and of each tokenmix train run over a --data-gb corpus (default: 50)",
    )
    group.add_argument(
        "--data-gb",
        type=Sizes("sizes in GiB"),
        default=[1.0, 16.0],
        help="--kinds data: GiB of generated text, prepared as bytes (2 bytes of shards per byte of text), that tokenmix train "
        "reads; its peak resident memory at each size (default: 1,16)",
    )
    group.add_argument(
        "--data-processes",
        type=Lengths("process counts"),
        default=[1, 2],
        help="--kinds data: the tokenmix train runs over each --data-gb corpus: one process, and each count > 1 started by "
        "torchrun (data parallel); the peak resident memory of each process (default: 1,2)",
    )
    group.add_argument(
        "--data-dir",
        type=Output("a folder for the corpora", folder=True),
        default=None,
        help="--kinds data: where the --data-gb corpora are prepared and kept for the next run (default: tokenmix-bench-data in "
        "the system's temporary folder); remove it when done",
    )
    group.add_argument(
        "--keep-text", action="store_true", help="--kinds data: keep the generated text of a corpus once prepared (by default deleted)"
    )


def add_pathfinder(parser) -> None:
    """Drawing generated Pathfinder images, --kinds pathfinder."""
    group = parser.add_argument_group("--kinds pathfinder")
    group.add_argument(
        "--pathfinder-resolutions",
        type=LengthsAmong("resolutions", RESOLUTIONS),
        default=[32, 128],
        help="--kinds pathfinder: image sides drawn, among 32,64,128,256 (default: 32,128)",
    )
    group.add_argument(
        "--pathfinder-difficulty",
        type=Choice(list(DIFFICULTIES)),
        default="hard",
        help="--kinds pathfinder: contour length 6, 9 or 14 (default: hard)",
    )
    group.add_argument(
        "--pathfinder-images",
        type=Integer(1),
        default=500,
        help="--kinds pathfinder: images drawn at 32 px; at R px N x 32 / R of them, at least 1 (default: 500: 125 at 128 px)",
    )


def add_outputs(parser) -> None:
    """The files a run writes: its records, plots and report."""
    group = parser.add_argument_group("outputs")
    group.add_argument(
        "--output",
        type=Output("a JSON file to write", folder=False),
        default=None,
        metavar="FILE.json",
        help="write the records as JSON, updated after every case",
    )
    group.add_argument(
        "--plot", type=Output("a folder for the plots", folder=True), default=None, metavar="DIR", help="write PNG plots into DIR"
    )
    group.add_argument(
        "--report",
        type=Output("a Markdown file to write", folder=False),
        default=None,
        metavar="FILE.md",
        help="write a Markdown report (tables, plots, reading)",
    )
