"""``tokenmix bench --kinds pathfinder``: how fast ``pathfinder-gen`` draws its images (``data.pathfinder_gen``),
what its cache saves, and what the images hold.

One ``pathfinder_gen`` record per ``--pathfinder-resolutions`` entry R at ``--pathfinder-difficulty``:

- ``images`` = ``images_at(R, --pathfinder-images)``: the count given at 32 px scaled by 32 / R (at least 1), so a
  run draws about the same number of pixel *rows* at every resolution (500 at 32, 250 at 64, 125 at 128, 62 at 256);
  ``seconds`` and ``images_per_second``: ``pathfinder_samples`` drawing them in this process (the draw
  ``pathfinder_images`` and ``load_pathfinder_gen`` make).
- ``cache_write_seconds``: ``load_pathfinder_gen`` with train = that count and val = test = 1 into an empty
  temporary cache (``$TOKENMIX_CACHE`` pointed there meanwhile, so the user's cache is untouched): drawing and
  writing; ``cache_load_seconds``: the same call again, reading the entry; ``cache_bytes``: its size.
- From the same samples: ``ink_fraction`` (mean over images of the fraction of pixels > 0; ``_p5`` / ``_p95``
  its 5th and 95th percentiles over images), ``label_balance`` (fraction of label 1) and ``binomial_p`` (exact
  two-sided test of a fair coin), ``distractors_mean`` (distractor contours drawn per image, of ``distractors_attempted``),
  ``paddles_mean`` (paddles drawn per image, targets included), and the settings (``pathfinder_settings``).

With ``--plot DIR``: ``pathfinder_examples.png``, a row per resolution of ``EXAMPLES`` images of label 1 then of
label 0, in grey levels, pixel for pixel.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import numpy as np

from ..data.cache import CACHE_VARIABLE
from ..data.pathfinder_gen import load_pathfinder_gen, pathfinder_samples, pathfinder_settings, sample_arrays
from ..io.progress import progress_bar
from ..io.table import format_table
from ..train.metrics import binomial_tail
from .data import timed

PATHFINDER_KINDS = ("pathfinder_gen",)
PATHFINDER: dict = {}  # no case settings: --kinds pathfinder builds no model
BASE_RESOLUTION = 32  # --pathfinder-images counts images at this resolution
SEED, SPLIT = 0, 0  # the train split of seed 0, as load_pathfinder_gen draws it
EXAMPLES = 4  # images of each label per row of the plot


def images_at(resolution: int, images: int) -> int:
    """Images drawn at ``resolution`` for ``images`` at 32 px: scaled by 32 / resolution, at least 1."""
    return max(1, round(images * BASE_RESOLUTION / resolution))


def binomial_p(ones: int, count: int) -> float:
    """Exact two-sided p-value of ``ones`` heads in ``count`` tosses of a fair coin: the probability of a count at
    least as far from count / 2, 2 P(X >= max(ones, count - ones)) capped at 1 (the law is symmetric)."""
    return min(1.0, 2 * binomial_tail(max(ones, count - ones), count, 0.5))


@contextlib.contextmanager
def temporary_cache():
    """``$TOKENMIX_CACHE`` pointed at a new temporary folder (yielded), removed and restored after."""
    saved = os.environ.get(CACHE_VARIABLE)
    with tempfile.TemporaryDirectory(prefix="tokenmix-bench-pathfinder-") as folder:
        os.environ[CACHE_VARIABLE] = folder
        try:
            yield Path(folder)
        finally:
            if saved is None:
                os.environ.pop(CACHE_VARIABLE, None)
            else:
                os.environ[CACHE_VARIABLE] = saved


def pathfinder_records(args, revision: str | None, keep) -> tuple[list[dict], dict[int, list]]:
    """Every record of ``--kinds pathfinder`` (``keep(records)`` after each), and per resolution the samples shown
    by the plot (``EXAMPLES`` of label 1, then of label 0)."""
    stamps = {"threads": args.threads, "numpy": np.__version__, "git_commit": revision}
    records, examples = [], {}
    for resolution in args.pathfinder_resolutions:
        record, samples = resolution_record(resolution, args.pathfinder_difficulty, images_at(resolution, args.pathfinder_images))
        records.append({**record, **stamps, "load_average": os.getloadavg()[0]})
        examples[resolution] = [s for label in (1, 0) for s in [s for s in samples if s.label == label][:EXAMPLES]]
        keep(records)
    return records, examples


def resolution_record(resolution: int, difficulty: str, count: int) -> tuple[dict, list]:
    """The ``pathfinder_gen`` record of ``count`` images at ``resolution`` (module docstring), and their samples."""
    settings = pathfinder_settings(resolution, difficulty)
    with progress_bar(total=count, desc=f"pathfinder: {resolution} px", unit="image") as bar:
        seconds, _, samples = timed(pathfinder_samples, settings, count, SEED, SPLIT, bar)
    images, labels = sample_arrays(settings, samples)
    with temporary_cache() as folder:
        options = {"resolution": resolution, "difficulty": difficulty, "train": count, "val": 1, "test": 1, "seed": SEED}
        write_seconds, _, _ = timed(load_pathfinder_gen, **options)
        load_seconds, _, _ = timed(load_pathfinder_gen, **options)
        cache_bytes = sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())
    ink = (images > 0).mean(axis=(1, 2))
    ones = int(labels.sum())
    distractors = [len(s.distractors) for s in samples]
    paddles = [sum(len(contour) for contour in (*s.contours, *s.distractors)) for s in samples]
    record = {
        "kind": "pathfinder_gen", "resolution": resolution, "difficulty": difficulty, "images": count,
        "seconds": seconds, "images_per_second": count / seconds,
        "cache_images": count + 2, "cache_write_seconds": write_seconds, "cache_load_seconds": load_seconds, "cache_bytes": cache_bytes,
        "ink_fraction": float(ink.mean()),
        "ink_fraction_p5": float(np.percentile(ink, 5)), "ink_fraction_p95": float(np.percentile(ink, 95)),
        "label_balance": ones / count, "binomial_p": binomial_p(ones, count),
        "distractors_mean": float(np.mean(distractors)), "distractors_attempted": settings.distractors,
        "paddles_mean": float(np.mean(paddles)), "contour_length": settings.contour_length,
        "distractor_length": settings.distractor_length, "paddle_length": settings.paddle_length,
        "marker_radius": settings.marker_radius, "paddle_margins": list(settings.paddle_margins),
    }  # fmt: skip
    return record, samples


def pathfinder_tables(records: list[dict]) -> str:
    """One row per resolution: drawing and cache times, ink, label balance, distractors."""
    rows = [
        {
            "resolution": r["resolution"], "difficulty": r["difficulty"], "images": r["images"], "seconds": r["seconds"],
            "images_s": r["images_per_second"], "cache_write_s": r["cache_write_seconds"], "cache_load_s": r["cache_load_seconds"],
            "ink": r["ink_fraction"], "ink_p5": r["ink_fraction_p5"], "ink_p95": r["ink_fraction_p95"],
            "label_1": r["label_balance"], "binomial_p": r["binomial_p"],
            "distractors": r["distractors_mean"], "attempted": r["distractors_attempted"], "paddles": r["paddles_mean"],
            "contour_length": r["contour_length"], "marker_radius": r["marker_radius"],
        }
        for r in records
    ]  # fmt: skip
    return format_table(rows, list(rows[0])) if rows else ""


def write_pathfinder_plot(examples: dict[int, list], directory) -> Path:
    """``pathfinder_examples.png`` in ``directory``: a row of example images per resolution, titled with their labels."""
    from .report import _finish, _pyplot

    plt = _pyplot()
    columns = 2 * EXAMPLES
    figure, axes = plt.subplots(len(examples), columns, figsize=(1.6 * columns, 1.8 * len(examples)), squeeze=False, layout="constrained")
    for row, (resolution, samples) in zip(axes, examples.items(), strict=True):
        for column, axis in enumerate(row):
            axis.set_xticks([])
            axis.set_yticks([])
            if column < len(samples):
                axis.imshow(samples[column].image, cmap="gray", vmin=0, vmax=255, interpolation="nearest")
                axis.set_title(f"label {samples[column].label}", fontsize=9)
            else:
                axis.set_axis_off()
        row[0].set_ylabel(f"{resolution} px")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    return _finish(plt, figure, directory / "pathfinder_examples.png")
