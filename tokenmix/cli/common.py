"""What the commands share: their threads and device flags, argument kinds, text a terminal shows."""

from __future__ import annotations

import unicodedata

from ..devices import resolve_device
from ..fields import Choice, Existing, Integer
from ..generation.graphs import DECODINGS
from ..ops.fused_toeplitz import KERNELS, check_fused_device, kernels
from ..precision import PRECISIONS
from ..runtime import set_threads
from ..train.config import DEVICE, TrainConfig
from .arguments import KeyValue

DEMO_PROMPT = "ROMEO.\n"


INTERRUPTED_STATUS = 130


THREADS = Integer(1)


DEVICE_HELP = TrainConfig.__dataclass_fields__["device"].metadata["help"]


RUN = Existing("a run directory, a checkpoint.pt or a model folder")


OPTION = KeyValue("KEY=VALUE")


def add_threads_and_device(parser, device_default: str = "cpu", threads_default: str = "torch's choice") -> None:
    parser.add_argument("--threads", type=THREADS, default=None, help=f"torch CPU threads (default: {threads_default})")
    parser.add_argument("--device", type=DEVICE, default=device_default, help=f"{DEVICE_HELP} (default: {device_default})")


def add_precision(parser) -> None:
    parser.add_argument(
        "--precision",
        type=Choice(list(PRECISIONS)),
        default="fp32",
        help="run the model's forward passes in this compute dtype (autocast; the weights stay as saved; docs/training.md) (default: fp32)",
    )


def add_kernels(parser) -> None:
    parser.add_argument(
        "--kernels",
        type=Choice(list(KERNELS)),
        default="auto",
        help="the Toeplitz mixers' fused Triton kernels (tno, fd_tno, causal ski_tno: the factored products of a training step, "
        "the static decoding step): auto (on CUDA where triton imports and they passed their probe, else PyTorch's), torch "
        "(PyTorch's, to compare or to rule them out) or fused (docs/training.md) (default: auto)",
    )


def kernels_of(args):
    """The ``kernels()`` block of ``--kernels``, refused first where the fused kernels cannot run on ``--device``."""
    if args.kernels == "fused":
        check_fused_device(resolve_device(args.device))
    return kernels(args.kernels)


def add_decoding(parser) -> None:
    parser.add_argument(
        "--decoding",
        type=Choice(list(DECODINGS)),
        default="auto",
        help="after the prompts: stream (the model's step), static (static buffers, replayed as a CUDA graph on CUDA) "
        "or auto (static on CUDA where the model has it, else stream; docs/inference.md) (default: auto)",
    )


def use_threads(args) -> None:
    if args.threads:
        set_threads(args.threads)


def printable(data: bytes) -> str:
    """Decoded text with control characters other than newline and tab shown as escapes (\\x1b, ...)."""
    return escaped(data.decode("utf-8", errors="replace"))


def escaped(text: str) -> str:
    return "".join(f"\\x{ord(c):02x}" if unicodedata.category(c) == "Cc" and c not in "\n\t" else c for c in text)
