"""``tokenmix export-hf``: a run as a transformers folder."""

from __future__ import annotations

from ..errors import user_input
from ..fields import Output
from ..runs import open_run
from .arguments import check_output_path
from .common import RUN


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "export-hf", help="write a run for Hugging Face transformers: config.json, model.safetensors, tokenizer (docs/hf.md)"
    )
    parser.add_argument("checkpoint", type=RUN, help="a run directory, checkpoint.pt or model folder (save_pretrained)")
    parser.add_argument(
        "out", type=Output("a folder to write", folder=True), help="the folder to write (refused if it holds files, unless --overwrite)"
    )
    parser.add_argument("--overwrite", action="store_true", help="write into a folder that holds files")
    parser.set_defaults(handler=run_export_hf)


def run_export_hf(args) -> int:
    with user_input():
        try:
            from .. import hf
        except ImportError as error:
            raise ValueError(str(error)) from None
        check_output_path(args.out, "out", directory=True)
        run = open_run(args.checkpoint)
        directory = hf.export(run.model, args.out, run.tokenizer, overwrite=args.overwrite)
    files = sorted(path.name for path in directory.iterdir())
    print(f"wrote {directory}: {', '.join(files)}")
    return 0
