"""``tokenmix plot``: pictures of Toeplitz operators and FD responses."""

from __future__ import annotations

from ..errors import user_input
from ..fields import Integer, Output
from ..runs import open_run
from .arguments import check_output_path
from .common import RUN


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("plot", help="PNG pictures: random FD responses (no RUN), or a trained run's Toeplitz operators")
    parser.add_argument("run", nargs="?", type=RUN, help="a run directory, checkpoint.pt or model folder; without it: random FD RPEs")
    parser.add_argument(
        "--out", type=Output("a folder for the pictures", folder=True), default="plots", help="output directory, created (default: plots)"
    )
    parser.add_argument("--length", type=Integer(1), default=256, help="sequence length of the pictured operators (default: 256)")
    parser.add_argument("--channel", type=Integer(0), help="channel pictured in a run's operator heatmaps (default: 0)")
    parser.set_defaults(handler=run_plot)


def run_plot(args) -> int:
    from .plots import plot_fd_responses, plot_operators, toeplitz_mixers

    with user_input():
        if args.run is None:
            if args.channel is not None:
                raise ValueError("--channel applies to a run's operator heatmaps: give RUN, or leave --channel out")
            check_output_path(args.out, "--out", directory=True)
            files = [plot_fd_responses(f"{args.out}/fd_responses_random.png", n=args.length)]
        else:
            channel = args.channel or 0
            model = open_run(args.run).model
            mixers = toeplitz_mixers(model)
            channels = min(mixer.dim for _, mixer in mixers)
            if channel >= channels:
                raise ValueError(f"--channel must be in [0, {channels - 1}]: the pictured mixers have {channels} channels")
            check_output_path(args.out, "--out", directory=True)
    if args.run is not None:
        files = plot_operators(model, args.out, n=args.length, channel=channel)
    print("\n".join(map(str, files)))
    return 0
