"""Benchmark plots (PNG) and the Markdown report, generated from measurement records.

The report states what was measured and what the numbers say (ratios, growth, comparisons); the
targets and the papers' claims they are read against live in the docs, not here.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from pathlib import Path

from ..io.files import save_figure
from ..io.table import format_table
from .cases import GENERATE_DEPTH, GENERATE_KINDS, GENERATE_SEGMENT, TRAINING_KINDS

BASE_COLUMNS = ["kind", "mixer", "causal", "length", "batch", "forward_ms", "forward_backward_ms", "tokens_per_s", "peak_mem_mb"]
FLOOR_COLUMNS = ["fft_floor_ms", "fwd_ratio_to_fft", "fwdbwd_ratio_to_fft"]
KIND_COLUMNS = {
    "generate": "kind mixer length batch prefill_ms step_ms recompute_ms recompute_ratio recompute_skipped state_bytes".split(),
    "generate_mixer": "kind mixer length dim tiled_s direct_s direct_tokens direct_finished direct_ratio max_abs_diff".split(),
    "precision": "kind mixer causal length dim precision output_error input_grad_error parameter_grad_error".split(),
}
DIRECTIONS = {False: "bidirectional", True: "causal"}


def sections(records: list[dict]) -> list[list[dict]]:
    """The records by table: the training kinds together, then each generate kind and the precision kind (empty ones left out)."""
    groups = [[r for r in records if r.get("kind", "mixer") in TRAINING_KINDS]]
    groups += [[r for r in records if r.get("kind") == kind] for kind in (*GENERATE_KINDS, "precision")]
    return [rows for rows in groups if rows]


def table_columns(records: list[dict]) -> list[str]:
    """The table's columns (those of its kind): the floor ones when any record has a floor, the error when any failed."""
    columns = list(KIND_COLUMNS.get(records[0]["kind"] if records else "mixer", BASE_COLUMNS))
    if any(record.get("fft_floor_ms") is not None for record in records):
        columns += FLOOR_COLUMNS
    if any(record.get("step_ratio") is not None for record in records):  # generate records from before it lack it
        columns.insert(columns.index("step_ms") + 1, "step_ratio")
    if any(record.get("static_step_ms") is not None for record in records):
        columns[columns.index("step_ms") + 1 : columns.index("step_ms") + 1] = ["static_step_ms", "static_speedup"]
    if any(record.get("error") for record in records):
        columns.append("error")
    return columns


def measured(records: list[dict]) -> list[dict]:
    return [record for record in records if not record.get("error")]


def _series(records: list[dict], kinds: tuple[str, ...] = TRAINING_KINDS) -> dict[tuple, list[dict]]:
    """The measured records of ``kinds`` by (kind, name, causal), each sorted by length."""
    groups = defaultdict(list)
    for record in measured(records):
        if record.get("kind", "mixer") in kinds:
            groups[(record["kind"], record["mixer"], record["causal"])].append(record)
    return {key: sorted(rows, key=lambda r: r["length"]) for key, rows in groups.items()}


def _label(key: tuple) -> str:
    kind, name, causal = key
    return f"{name} {kind} ({DIRECTIONS[causal]})"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _panels(series: dict[tuple, list[dict]]) -> list[tuple[str, bool]]:
    """(kind, causal) pairs present, in a fixed order: one plot panel each."""
    present = {(kind, causal) for kind, _, causal in series}
    return [(kind, causal) for kind in ("mixer", "layer", "model") for causal in (False, True) if (kind, causal) in present]


def _grid(plt, panels: list[tuple[str, bool]], columns_per_panel: int = 1):
    """A figure with one row per kind and a block of columns per direction measured; {panel: its axes}."""
    kinds = [kind for kind in ("mixer", "layer", "model") if any(k == kind for k, _ in panels)]
    directions = [causal for causal in (False, True) if any(c == causal for _, c in panels)]
    width = columns_per_panel * len(directions)
    figure, axes = plt.subplots(len(kinds), width, figsize=(6.5 * width, 3.8 * len(kinds)), squeeze=False, layout="constrained")
    slots = {}
    for row, kind in enumerate(kinds):
        for block, causal in enumerate(directions):
            cells = list(axes[row][block * columns_per_panel : (block + 1) * columns_per_panel])
            if (kind, causal) in panels:
                slots[(kind, causal)] = cells
            else:
                for axis in cells:
                    axis.set_visible(False)
    return figure, slots


def _finish(plt, figure, path: Path) -> Path:
    try:
        return save_figure(figure, path)
    finally:
        plt.close(figure)


def _against_length(axis, ylabel: str, title: str, log_y: bool = True, xlabel: str = "sequence length") -> None:
    """Log-length x axis, labels, plain tick labels, grid and a legend beside the panel."""
    axis.set(xscale="log", yscale="log" if log_y else "linear", xlabel=xlabel, ylabel=ylabel, title=title)
    _legend(axis)


# Mantissas of the labels of a log axis, from sparse to dense: the first that labels 3 to 8 values in the data's range.
LOG_LABELS = ((1,), (1, 2, 5), (1, 1.5, 2, 3, 5, 7), (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8, 9))


def log_ticks(low: float, high: float) -> list[float]:
    """Values to label on a log axis spanning [low, high]: round numbers, at least 3 where the range allows."""
    ticks: list[float] = []
    for mantissas in LOG_LABELS:
        decades = range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1)
        ticks = [m * 10.0**d for d in decades for m in mantissas if low <= m * 10.0**d <= high]
        if len(ticks) >= 3:
            return ticks if len(ticks) <= 8 else ticks[:: math.ceil(len(ticks) / 8)]
    return ticks or [low, high]


def _legend(axis) -> None:
    """Plain tick labels: on a log axis at the x data (sequence lengths) or at round values (``log_ticks``), no
    minor labels; a grid; the legend beside the panel."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    plain = FuncFormatter(lambda value, _: f"{value:g}")
    for ticks, scale, limits in ((axis.xaxis, axis.get_xscale(), axis.get_xlim()), (axis.yaxis, axis.get_yscale(), axis.get_ylim())):
        if scale == "log":
            data = sorted({float(v) for line in axis.get_lines() for v in (line.get_xdata() if ticks is axis.xaxis else ())})
            ticks.set_major_locator(FixedLocator(data if 2 <= len(data) <= 10 else log_ticks(*limits)))
            ticks.set_minor_formatter(NullFormatter())
        ticks.set_major_formatter(plain)
    axis.grid(True, which="both", alpha=0.3)
    if axis.get_legend_handles_labels()[0]:
        axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


def write_plots(records: list[dict], directory) -> list[Path]:
    """time_vs_length.png, ratios.png (FFT-based mixers) and memory.png, one panel per kind and
    direction, and the generate kinds' decode.png and mixer_decode.png; returns the paths written."""
    plt = _pyplot()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    return _training_plots(plt, records, directory) + _generate_plots(plt, records, directory)


def _training_plots(plt, records: list[dict], directory: Path) -> list[Path]:
    series = _series(records)
    panels = _panels(series)
    written = []
    if not panels:
        return written

    figure, slots = _grid(plt, panels, columns_per_panel=2)
    for (kind, name, causal), rows in series.items():
        lengths = [r["length"] for r in rows]
        forward_axis, train_axis = slots[(kind, causal)]
        (line,) = forward_axis.plot(lengths, [r["forward_ms"] for r in rows], marker="o", label=name)
        train_axis.plot(lengths, [r["forward_backward_ms"] for r in rows], marker="o", label=name, color=line.get_color())
    for (kind, causal), (forward_axis, train_axis) in slots.items():
        for axis, what in ((forward_axis, "eval forward"), (train_axis, "training step")):
            _against_length(axis, "median time (ms)", f"{kind}s, {DIRECTIONS[causal]}: {what}")
    figure.suptitle("Time per call against sequence length")
    written.append(_finish(plt, figure, directory / "time_vs_length.png"))

    fft_series = {key: rows for key, rows in series.items() if rows[0].get("fft_floor_ms") is not None}
    if fft_series:
        directions = sorted({causal for _, _, causal in fft_series})
        figure, axes = plt.subplots(1, len(directions), figsize=(7.5 * len(directions), 4.5), squeeze=False, layout="constrained")
        for (_, name, causal), rows in fft_series.items():
            axis = axes[0][directions.index(causal)]
            lengths = [r["length"] for r in rows]
            (line,) = axis.plot(lengths, [r["fwdbwd_ratio_to_fft"] for r in rows], marker="o", label=f"{name} training step")
            axis.plot(
                lengths,
                [r["fwd_ratio_to_fft"] for r in rows],
                marker="s",
                linestyle="--",
                color=line.get_color(),
                label=f"{name} eval forward",
            )
        for causal, axis in zip(directions, axes[0], strict=True):
            axis.axhline(1.0, color="gray", linestyle=":", label="the floor")
            _against_length(axis, "time / fastest bare rfft + irfft", f"FFT-based mixers, {DIRECTIONS[causal]}", log_y=False)
        written.append(_finish(plt, figure, directory / "ratios.png"))

    figure, slots = _grid(plt, panels)
    for (kind, name, causal), rows in series.items():
        slots[(kind, causal)][0].plot([r["length"] for r in rows], [r["peak_mem_mb"] for r in rows], marker="o", label=name)
    for (kind, causal), (axis,) in slots.items():
        _against_length(axis, "peak memory of a training step (MB)", f"{kind}s, {DIRECTIONS[causal]}")
    written.append(_finish(plt, figure, directory / "memory.png"))
    return written


def _generate_plots(plt, records: list[dict], directory: Path) -> list[Path]:
    """decode.png: per-token time (cached step, recompute) and state size against the position, one
    line per model; mixer_decode.png: per-token time against the position, tiled and direct, one panel per L."""
    written = []
    models = _series(records, ("generate",))
    if models:
        figure, (time_axis, state_axis) = plt.subplots(1, 2, figsize=(13, 4.5), layout="constrained")
        for (_, name, _), rows in models.items():
            positions = [r["length"] for r in rows]
            (line,) = time_axis.plot(positions, [r["step_ms"] for r in rows], marker="o", label=f"{name} cached step")
            recomputed = [r for r in rows if r["recompute_ms"] is not None]
            if recomputed:
                time_axis.plot(
                    [r["length"] for r in recomputed], [r["recompute_ms"] for r in recomputed],
                    marker="s", linestyle="--", color=line.get_color(), label=f"{name} recompute",
                )  # fmt: skip
            state_axis.plot(positions, [r["state_bytes"] / 2**20 for r in rows], marker="o", color=line.get_color(), label=name)
        _against_length(time_axis, "time per token (ms)", "next token at position P: cached step vs recompute", xlabel="position P")
        _against_length(state_axis, "state size (MB)", "the decoding state at position P", xlabel="position P")
        written.append(_finish(plt, figure, directory / "decode.png"))
    mixers = _series(records, ("generate_mixer",))
    if mixers:
        lengths = sorted({r["length"] for rows in mixers.values() for r in rows})
        figure, axes = plt.subplots(1, len(lengths), figsize=(6.5 * len(lengths), 4.5), squeeze=False, layout="constrained")
        for (_, name, _), rows in mixers.items():
            for r in rows:
                axis = axes[0][lengths.index(r["length"])]
                for path, style in (("tiled", "-"), ("direct", "--")):
                    curve = r[f"{path}_curve"]
                    stopped = "" if path == "tiled" or r["direct_finished"] else f" (stopped after {r['direct_tokens']} tokens)"
                    label = f"{name} {path}{stopped}"
                    axis.plot([w["to"] for w in curve], [w["ms_per_token"] for w in curve], marker=".", linestyle=style, label=label)
        for length, axis in zip(lengths, axes[0], strict=True):
            _against_length(
                axis, "time per token (ms, window mean)", f"decoding {length} tokens one by one", xlabel="position (window end)"
            )
        written.append(_finish(plt, figure, directory / "mixer_decode.png"))
    return written


def _range(values: list[float]) -> str:
    return f"{min(values):.2f}x" if len(values) == 1 else f"{min(values):.2f}x to {max(values):.2f}x"


def reading(records: list[dict]) -> list[str]:
    """Sentences computed from the records: ratios to the FFT floor, how time grows, comparisons."""
    lines = []
    for key, rows in _series(records).items():
        label = _label(key)
        if rows[0].get("fft_floor_ms") is not None:
            ratios = ", ".join(f"{r['length']}: {r['fwd_ratio_to_fft']:.2f}x / {r['fwdbwd_ratio_to_fft']:.2f}x" for r in rows)
            lines.append(f"{label} against the FFT floor (eval forward / training step), by length: {ratios}.")
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
    lines += _generate_reading(records)
    failed = [r for r in records if r.get("error")]
    lines += [f"{r['mixer']} {r['kind']} ({DIRECTIONS[r['causal']]}) at length {r['length']} failed: {r['error']}" for r in failed]
    return lines


def _comparisons(records: list[dict]) -> list[str]:
    """Different names of one kind at the same length: time and memory against the first name measured."""
    groups = defaultdict(list)
    for record in measured(records):
        if record.get("kind", "mixer") in TRAINING_KINDS:
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
            lines.append(f"{kind} training step at length {length} ({DIRECTIONS[causal]}), relative to {base['mixer']}: {others}.")
    return lines


def _generate_reading(records: list[dict]) -> list[str]:
    """Decoding: how a step's time and the state grow with the position, recompute against cached, tiled against direct."""
    lines = []
    for (_, name, _), rows in _series(records, ("generate",)).items():
        first, last = rows[0], rows[-1]
        steps = ", ".join(f"{r['length']}: {r['step_ms']:.3g} ms" for r in rows)
        states = ", ".join(f"{r['length']}: {r['state_bytes'] / 2**20:.3g} MB" for r in rows)
        line = f"{name}: a cached decode step by position, {steps}"
        if len(rows) > 1:
            line += f" ({last['step_ms'] / first['step_ms']:.2f}x for {last['length'] / first['length']:g}x the position)"
        lines.append(f"{line}; the state, {states}.")
        speedups = ", ".join(f"{r['length']}: {r['static_speedup']:.3g}x" for r in rows if r.get("static_speedup") is not None)
        if speedups:
            how = "a CUDA graph" if str(first["device"]).startswith("cuda") else "eager"
            lines.append(f"{name}: the static step ({how}) against the stream step, by position: {speedups}.")
        ratios = ", ".join(f"{r['length']}: {r['recompute_ratio']:.3g}x" for r in rows if r["recompute_ratio"] is not None)
        skipped = ", ".join(str(r["length"]) for r in rows if r["recompute_skipped"])
        if ratios:
            lines.append(f"{name}: recomputing the prefix costs this many cached steps, by position: {ratios}.")
        if skipped:
            lines.append(f"{name}: not recomputed at positions {skipped} (above --recompute-max).")
    for (_, name, _), rows in _series(records, ("generate_mixer",)).items():
        for r in rows:
            head = f"{name} (width {r['dim']}) decoding {r['length']} tokens one by one: tiled {r['tiled_s']:.3g} s"
            if r["direct_finished"]:
                diff = f"; outputs differ by at most {r['max_abs_diff']:.2g}" if r["max_abs_diff"] is not None else ""
                lines.append(f"{head}, direct {r['direct_s']:.3g} s ({r['direct_ratio']:.3g}x the tiled time){diff}.")
            else:
                lines.append(
                    f"{head}; the direct product was stopped after {r['direct_tokens']} of {r['length']} tokens "
                    f"in {r['direct_s']:.3g} s (--direct-max-seconds), so it has no total."
                )
    return lines


KIND_TITLES = {
    "mixer": "Mixers",
    "layer": "Layers",
    "model": "Models",
    "generate": "Decoding by the models",
    "generate_mixer": "Decoding by a Toeplitz mixer, token by token",
}
KIND_NOTES = {
    "generate": [
        f"Causal LM models of depth {GENERATE_DEPTH}, `batch` sequences (--generate-batch). `length` is the position P:",
        "one prefill call of P random tokens builds the state (`prefill_ms`, that one call) whose size is `state_bytes`;",
        "`step_ms` is the median single-token step from it after warm-up (each step moves the position on by one);",
        "`recompute_ms` is the median forward over the P + 1 tokens without a state, the cost of a next token without a",
        "cache, skipped above --recompute-max; `recompute_ratio` = recompute_ms / step_ms. `step_ratio`: the step at P",
        "over the step at position 256, the two timed alternately in one process; `static_step_ms`, with them, the step",
        "of models that decode from static buffers (a CUDA graph's replay on CUDA, the static step run eagerly on the",
        "CPU), and `static_speedup` = step_ms / static_step_ms. Rows 'NAME (ssm N)' (--distilled N):",
        "the model with its Toeplitz mixers replaced by N-mode state spaces. Recurrent (XL) models stream in segments",
        f"of {GENERATE_SEGMENT} tokens.",
    ],
    "generate_mixer": [
        "`length` L inputs decoded one by one, once per path: `tiled_s` by `mixer.step` (the tiled relaxed product,",
        "O(L log^2 L) in all; for 'ssm (order N)', --distilled N, the recurrence, O(L N)), `direct_s` by the direct",
        "product over the whole history (`naive_online_step`, O(L^2)), the taps of both computed before the clock",
        "starts. The direct run stops at --direct-max-seconds: `direct_tokens` says how far it got; `direct_ratio` =",
        "direct_s / tiled_s where it finished. `max_abs_diff`: the largest difference of the two paths' outputs at the",
        "ends of the windows both timed.",
    ],
}


def markdown_report(records: list[dict], command: str, machine: str, plot_paths: list[Path], report_path) -> str:
    report_dir = Path(report_path).resolve().parent
    revisions = sorted({str(r.get("git_commit")) for r in records})
    allocator = sorted({str(r.get("retain_freed_memory")) for r in records})
    parts = [
        "# Benchmarks",
        "",
        f"Generated by `{command}` on {machine}, source {', '.join(revisions)}, retain_freed_memory {', '.join(allocator)}.",
        "Do not edit by hand: re-run the command.",
        "",
    ]
    if any(r.get("kind", "mixer") in TRAINING_KINDS for r in records):
        parts += [
            "Times are medians of repeats after warm-up. Peak memory is that of one training step: on CPU the peak",
            "resident size of a fresh process over its size just before the step; on CUDA `max_memory_allocated`.",
            "The FFT floor is the fastest bare `torch.fft.rfft` + `irfft` round trip of the same data at the FFT size",
            "the mixer uses (N >= 2n), over two layouts: along the length of the (batch, length, channels) tensor as",
            "given, and along the last dimension of a contiguous (batch, channels, length) copy; the JSON records both.",
            "A 2-D mixer (tno2d) lays a length L on its near-square grid (H, W) (32 x 32 at 1024 tokens): its floor is the",
            "2-D round trip at sizes >= (2H - 1, 2W - 1), in the same two layouts.",
            "",
        ]
    for kind, title in KIND_TITLES.items():
        rows = [r for r in records if r.get("kind", "mixer") == kind]
        if rows:
            dims = sorted({r["dim"] for r in rows})
            notes = [*KIND_NOTES[kind], ""] if kind in KIND_NOTES else []
            parts += [f"## {title} (dim {', '.join(map(str, dims))})", "", *notes, format_table(rows, table_columns(rows)), ""]
    if plot_paths:
        parts += ["## Plots", ""]
        parts += [f"![{Path(path).stem}]({os.path.relpath(Path(path).resolve(), report_dir)})" for path in plot_paths]
        parts += [""]
    parts += ["## Reading (computed from the tables above)", ""]
    parts += [f"- {line}" for line in reading(records)]
    parts += profile_sections(records)
    return "\n".join(parts) + "\n"


def profile_sections(records: list[dict]) -> list[str]:
    """One table per profiled case: the operators taking most of its training step."""
    profiled = [record for record in measured(records) if record.get("profile")]
    if not profiled:
        return []
    parts = ["", "## Where a training step's time goes (torch.profiler, per step: the operators on a CPU, the kernels on CUDA)", ""]
    for record in profiled:
        parts += [
            f"### {_label((record['kind'], record['mixer'], record['causal']))}, length {record['length']}, batch {record['batch']}",
            "",
        ]
        if record.get("busy_ms") is not None:  # CUDA: the rest of the step the device waits on the host
            busy, step = record["busy_ms"], record["forward_backward_ms"]
            parts += [f"The device is busy {busy:.4g} ms of the step's {step:.4g} ms ({busy / step:.0%}).", ""]
        rows = [{"op": row["op"], "self_ms": row["self_ms"], "share": f"{row['share']:.1%}"} for row in record["profile"]]
        parts += [format_table(rows, ["op", "self_ms", "share"]), ""]
    return parts
