"""Benchmark plots (PNG) and the Markdown report, generated from measurement records."""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

from ..table import format_table

TABLE_COLUMNS = [
    "kind",
    "mixer",
    "causal",
    "length",
    "batch",
    "forward_ms",
    "forward_backward_ms",
    "tokens_per_s",
    "peak_mem_mb",
    "fft_floor_ms",
    "fwd_ratio_to_fft",
    "fwdbwd_ratio_to_fft",
]
# Foundation issue targets for the Toeplitz mixers, as multiples of a bare rfft + irfft round trip.
EVAL_TARGET, TRAIN_TARGET = 1.3, 3.5
TARGETED = ("tno", "fd_tno")
# The papers' speed claims (shared/references.md) and where the report tests them.
CLAIMS = [
    "TNN (paper 002): O(n log n) token mixing. See the growth of training time per token with length below "
    "(1.0x would be linear; log-linear gives a slow rise) and the TNO rows against the FFT round trip.",
    "FNetAR (paper 003): expected to be faster than Transformer-XL, which it replaces half the attention layers of. "
    "See the fnet_ar_xl against transformer_xl layer and model lines below.",
    "FD-TNN and SKI-TNN (paper 000: FD 5-15% faster causal, 35-80% faster bidirectional; SKI 25-30% faster with "
    "17-42% less memory). See the mixer lines 'relative to tno' below: a time ratio of 0.77x is 1.3x faster.",
    "TCN against EMA (paper 004: the TCN up to 7.07x / 2.86x faster forward / backward, 8k-131k tokens, V100). "
    "Run with --mixers tcn,ema and see the lines 'relative to tcn' below: ema's time ratios are the TCN's speed-ups.",
]


def _series(records: list[dict]) -> dict[tuple, list[dict]]:
    groups = defaultdict(list)
    for record in records:
        groups[(record["kind"], record["mixer"], record["causal"])].append(record)
    return {key: sorted(rows, key=lambda r: r["length"]) for key, rows in groups.items()}


def _label(key: tuple) -> str:
    kind, name, causal = key
    return f"{name} {kind} ({'causal' if causal else 'bidirectional'})"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _finish(figure, axes, path: Path) -> Path:
    """Grid on every axis, a small legend on the last one, save as PNG and close."""
    for axis in axes:
        axis.grid(True, which="both", alpha=0.3)
    axes[-1].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    _pyplot().close(figure)
    return path


def write_plots(records: list[dict], directory) -> list[Path]:
    """time_vs_length.png, ratios.png (FFT-based mixers) and memory.png; returns the paths written."""
    plt = _pyplot()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    series = _series(records)
    written = []

    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for key, rows in series.items():
        lengths = [r["length"] for r in rows]
        axes[0].plot(lengths, [r["forward_ms"] for r in rows], marker="o", label=_label(key))
        axes[1].plot(lengths, [r["forward_backward_ms"] for r in rows], marker="o", label=_label(key))
        if rows[0]["fft_floor_ms"] is not None:
            for axis in axes:
                axis.plot(lengths, [r["fft_floor_ms"] for r in rows], linestyle=":", color="gray")
    for axis, title in zip(axes, ["forward, eval mode", "forward + backward, training mode"], strict=True):
        axis.set(xscale="log", yscale="log", xlabel="sequence length", ylabel="median time (ms)", title=title)
    figure.suptitle("time per call (dotted: bare rfft+irfft round trip)")
    written.append(_finish(figure, axes, directory / "time_vs_length.png"))

    fft_series = {key: rows for key, rows in series.items() if rows[0]["fft_floor_ms"] is not None}
    if fft_series:
        figure, axis = plt.subplots(figsize=(6.5, 4.2))
        for key, rows in fft_series.items():
            lengths = [r["length"] for r in rows]
            label = _label(key)
            (line,) = axis.plot(lengths, [r["fwdbwd_ratio_to_fft"] for r in rows], marker="o", label=f"{label} fwd+bwd")
            axis.plot(
                lengths, [r["fwd_ratio_to_fft"] for r in rows], marker="s", linestyle="--", color=line.get_color(), label=f"{label} fwd"
            )
        axis.axhline(EVAL_TARGET, color="gray", linestyle=":", label=f"eval target {EVAL_TARGET}x")
        axis.axhline(TRAIN_TARGET, color="black", linestyle=":", label=f"train target {TRAIN_TARGET}x")
        axis.set(xscale="log", xlabel="sequence length", ylabel="time / FFT round trip", title="FFT-based mixers against the FFT floor")
        written.append(_finish(figure, [axis], directory / "ratios.png"))

    figure, axis = plt.subplots(figsize=(6.5, 4.2))
    for key, rows in series.items():
        axis.plot([r["length"] for r in rows], [r["peak_mem_mb"] for r in rows], marker="o", label=_label(key))
    axis.set(xscale="log", yscale="log", xlabel="sequence length", ylabel="peak memory of a training step (MB)", title="memory")
    written.append(_finish(figure, [axis], directory / "memory.png"))
    return written


def _range(values: list[float]) -> str:
    return f"{min(values):.2f}x" if len(values) == 1 else f"{min(values):.2f}x to {max(values):.2f}x"


def reading(records: list[dict]) -> list[str]:
    """Sentences computed from the records: the targets met or missed, and how time grows."""
    lines = []
    for key, rows in _series(records).items():
        label = _label(key)
        if rows[0]["fft_floor_ms"] is not None:
            forward = [r["fwd_ratio_to_fft"] for r in rows]
            train = [r["fwdbwd_ratio_to_fft"] for r in rows]
            lengths = ", ".join(str(r["length"]) for r in rows)
            targeted = key[1] in TARGETED
            eval_verdict = f" (target <= {EVAL_TARGET}x: {'met' if max(forward) <= EVAL_TARGET else 'missed'})" if targeted else ""
            train_verdict = f" (target <= {TRAIN_TARGET}x: {'met' if max(train) <= TRAIN_TARGET else 'missed'})" if targeted else ""
            lines.append(
                f"{label}, lengths {lengths}: eval forward {_range(forward)} the FFT round trip{eval_verdict}; "
                f"training forward+backward {_range(train)}{train_verdict}."
            )
        if len(rows) > 1:
            first, last = rows[0], rows[-1]
            per_token = (last["forward_backward_ms"] / (last["batch"] * last["length"])) / (
                first["forward_backward_ms"] / (first["batch"] * first["length"])
            )
            before_last = rows[-2]
            lines.append(
                f"{label}: training time per token grows {per_token:.2f}x from length {first['length']} to {last['length']} "
                f"({last['length'] // first['length']}x longer; 1.0x would be linear), "
                f"{last['tokens_per_s']:,.0f} tokens/s at {last['length']}; the training step takes "
                f"{last['forward_backward_ms'] / before_last['forward_backward_ms']:.2f}x as long at {last['length']} "
                f"as at {before_last['length']}."
            )
    lines += _comparisons(records)
    return lines


def _comparisons(records: list[dict]) -> list[str]:
    """Different names of one kind at the same length: time and memory against the first name measured."""
    groups = defaultdict(list)
    for record in records:
        groups[(record["kind"], record["causal"], record["length"])].append(record)
    lines = []
    for (kind, causal, length), rows in groups.items():
        if len(rows) > 1:
            base = rows[0]
            others = ", ".join(
                f"{r['mixer']} {r['forward_backward_ms'] / base['forward_backward_ms']:.2f}x time, "
                f"{r['peak_mem_mb'] / base['peak_mem_mb']:.2f}x memory (eval forward {r['forward_ms'] / base['forward_ms']:.2f}x time)"
                for r in rows[1:]
            )
            mode = "causal" if causal else "bidirectional"
            lines.append(f"{kind} training step at length {length} ({mode}), relative to {base['mixer']}: {others}.")
    return lines


def markdown_report(records: list[dict], command: str, machine: str, plot_paths: list[Path], report_path) -> str:
    report_dir = Path(report_path).resolve().parent
    parts = [
        "# Benchmarks",
        "",
        f"Generated by `{command}` on {machine}. Do not edit by hand: re-run the command.",
        "",
        "Times are medians of repeats after warm-up. Peak memory is that of one training step: on CPU the peak",
        "resident size of a fresh process over its size just before the step; on CUDA `max_memory_allocated`.",
        "The FFT floor is a bare `torch.fft.rfft` + `irfft` round trip of the same (batch, length, channels)",
        "tensor along the length dimension at the FFT size the mixer uses (N >= 2n).",
        "",
    ]
    for kind in ("mixer", "layer", "model"):
        rows = [r for r in records if r["kind"] == kind]
        if rows:
            columns = TABLE_COLUMNS if kind == "mixer" else [c for c in TABLE_COLUMNS if "fft" not in c]
            dims = sorted({r["dim"] for r in rows})
            parts += [f"## {kind.capitalize()}s (dim {', '.join(map(str, dims))})", "", format_table(rows, columns), ""]
    parts += ["## Plots", ""]
    parts += [f"![{Path(path).stem}]({os.path.relpath(Path(path).resolve(), report_dir)})" for path in plot_paths]
    parts += ["", "## The papers' claims", ""]
    parts += [f"- {claim}" for claim in CLAIMS]
    parts += ["", "## Reading (computed from the tables above)", ""]
    parts += [f"- {line}" for line in reading(records)]
    return "\n".join(parts) + "\n"


def comparison_rows(before: list[dict], after: list[dict]) -> list[dict]:
    """Records measured in both runs, matched by (kind, mixer, causal, length), with speed-ups."""
    key = lambda record: (record.get("kind", "mixer"), record["mixer"], record["causal"], record["length"])  # noqa: E731
    earlier = {key(record): record for record in before}
    rows = []
    for record in after:
        old = earlier.get(key(record))
        if old is None:
            continue
        rows.append(
            {
                "kind": key(record)[0],
                "mixer": record["mixer"],
                "causal": record["causal"],
                "length": record["length"],
                "forward_ms_before": old["forward_ms"],
                "forward_ms_after": record["forward_ms"],
                "forward_speedup": old["forward_ms"] / record["forward_ms"],
                "forward_backward_ms_before": old["forward_backward_ms"],
                "forward_backward_ms_after": record["forward_backward_ms"],
                "forward_backward_speedup": old["forward_backward_ms"] / record["forward_backward_ms"],
                "fwdbwd_ratio_to_fft_before": old.get("fwdbwd_ratio_to_fft"),
                "fwdbwd_ratio_to_fft_after": record.get("fwdbwd_ratio_to_fft"),
            }
        )
    return rows
