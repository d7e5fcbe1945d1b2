"""Generated Pathfinder (tokenmix/data/pathfinder_gen.py): the label agrees with what is drawn, at every LRA
resolution; the settings, determinism, label balance, image statistics and the ``pathfinder-gen`` source."""

import functools
import math

import numpy as np
import pytest
import torch

from tokenmix.cli import main
from tokenmix.data import load_data
from tokenmix.data import pathfinder_gen as module
from tokenmix.data.pathfinder_gen import PathfinderGenerator, PathfinderSettings, pathfinder_images, pathfinder_settings

# images per resolution for the connectivity test (10-45 s each on one core, most for 256 px); 64 and 128 px at
# the hard difficulty need about a thousand draws of the two targets per image, so intermediate stands for
# them here and test_hard_targets_need_many_draws_and_still_connect checks 64 hard images of each
CONNECTIVITY = [(32, "hard", 1000), (64, "intermediate", 1000), (128, "intermediate", 1000), (256, "hard", 1000)]


@functools.cache
def samples(resolution: int, difficulty: str, count: int, seed: int = 0) -> tuple:
    generator = PathfinderGenerator(pathfinder_settings(resolution, difficulty))
    drawn = []
    for chunk, start in enumerate(range(0, count, 64)):
        drawn += generator.draw(min(64, count - start), np.random.default_rng((seed, chunk)))
    return tuple(drawn)


def segment_distances(points: np.ndarray, segments: np.ndarray) -> np.ndarray:
    """(P, S) distances from points (P, 2) to segments (S, 2, 2)."""
    start, along = segments[:, 0], segments[:, 1] - segments[:, 0]
    t = np.clip(((points[:, None] - start) * along).sum(-1) / (along * along).sum(-1), 0, 1)
    return np.linalg.norm(points[:, None] - (start + t[..., None] * along), axis=-1)


def points_along(ends: np.ndarray, count: int = 11) -> np.ndarray:
    """``count`` points along each paddle (n, 2, 2), (n · count, 2)."""
    t = np.linspace(0, 1, count)[:, None]
    return (ends[:, None, 0] + t * (ends[:, None, 1] - ends[:, None, 0])).reshape(-1, 2)


def threshold(images) -> int:
    """Half the dimmest nonzero pixel of ``images``. The images have no noise: the background is exactly 0 and
    every nonzero pixel is ink, at least one sub-pixel point of a paddle or marker (the dimmest level, near 60
    at every resolution); halfway down to 0 keeps all of it whatever the contrasts and the scaling."""
    return int(min(image[image > 0].min() for image in images)) // 2


class UnionFind:
    def __init__(self, count: int):
        self.parent = list(range(count))

    def find(self, node: int) -> int:
        while self.parent[node] != node:
            self.parent[node] = self.parent[self.parent[node]]  # path halving
            node = self.parent[node]
        return node

    def join(self, a: int, b: int) -> None:
        self.parent[self.find(a)] = self.find(b)


def marker_core(settings: PathfinderSettings) -> float:
    """The radius within which a marker covers every pixel fully: r - √2 (aa - 1) / (2 aa)."""
    aa = settings.antialias_scale
    return settings.marker_radius - math.sqrt(2) * (aa - 1) / (2 * aa)


def find_markers(image: np.ndarray, settings: PathfinderSettings) -> set:
    """The markers' centres as the image shows them: the pixels whose darkest pixel within ``marker_core`` is
    the brightest of any pixel's. Where a marker covers a pixel fully the image is at least the marker's level
    (a max with the ink), and no paddle is wide enough to cover such a disc that brightly."""
    span = math.floor(marker_core(settings))
    offsets = np.argwhere(np.hypot(*np.mgrid[-span : span + 1, -span : span + 1]) <= marker_core(settings)) - span
    bright = np.argwhere(image > 0)  # a marker's centre is never dark
    inside = np.clip(bright[:, None] + offsets, 0, image.shape[0] - 1)
    darkest = image[inside[..., 0], inside[..., 1]].min(axis=1)
    return {tuple(pixel) for pixel in bright[darkest == darkest.max()].tolist()}


def through_ink(sample, settings: PathfinderSettings, level: int, markers) -> tuple[bool, list[int]]:
    """(whether the two ``markers`` (pixels) are joined through the ink of one target contour, how many
    pieces each target's ink forms).

    Ink: the pixels at ``level`` or above. Each belongs to the nearest paddle of any contour (targets and
    distractors, as the sample lists them) within t/2 + 1 px. Two 8-adjacent ink pixels of one target contour
    are joined, and so are, across each gap between consecutive paddles, the pixels nearest to its two ends.
    Ink alone cannot tell contours apart: the collision rule keeps contours only about as far apart as a
    contour's own gaps (2m), at 32 px under 1 px, so at 32 px hard most negatives' markers would be joined
    through the whole ink with the gaps bridged; the paddles say which ink is whose, the pixels whether that
    ink is there, unbroken, and under the markers. Also checks that all ink is a paddle's or a marker's.
    """
    ink = np.argwhere(sample.image >= level)
    contours = [*sample.contours, *sample.distractors]
    contour = np.concatenate([np.full(len(paddles), k) for k, paddles in enumerate(contours)])
    distance = segment_distances(ink.astype(float), np.concatenate(contours))
    nearest, closest = distance.argmin(axis=1), distance.min(axis=1)
    to_marker = np.linalg.norm(ink[:, None] - sample.markers, axis=-1).min(axis=1)
    reach = np.minimum(closest - settings.paddle_thickness / 2, to_marker - settings.marker_radius)
    assert reach.max() <= 1, "ink away from every paddle and marker"
    owner = np.where((closest <= settings.paddle_thickness / 2 + 1) & (contour[nearest] < 2), contour[nearest], -1)
    paddle = np.concatenate([np.arange(len(paddles)) for paddles in contours])[nearest]
    index = np.full(sample.image.shape, -1)
    index[ink[:, 0], ink[:, 1]] = np.arange(len(ink))
    padded = np.pad(index, 1, constant_values=-1)
    pieces = UnionFind(len(ink))
    for dy, dx in ((0, 1), (1, -1), (1, 0), (1, 1)):  # half of the 8 neighbours: each pair once
        neighbour = padded[ink[:, 0] + 1 + dy, ink[:, 1] + 1 + dx]
        same = (neighbour >= 0) & (owner >= 0) & (owner == owner[neighbour])
        for i, j in zip(np.flatnonzero(same).tolist(), neighbour[same].tolist(), strict=True):
            pieces.join(i, j)
    for k, ends in enumerate(sample.contours):
        for gap in range(len(ends) - 1):
            sides = []
            for side, end in ((gap, ends[gap, 1]), (gap + 1, ends[gap + 1, 0])):
                mine = np.flatnonzero((owner == k) & (paddle == side))
                assert mine.size, f"target {k} paddle {side} has no ink"
                sides.append(mine[np.linalg.norm(ink[mine] - end, axis=1).argmin()])
            pieces.join(*sides)
    assert len(markers) == 2, f"{len(markers)} markers"
    markers = [index[marker] for marker in markers]
    assert min(markers) >= 0 and (owner[markers] >= 0).all(), "a marker's centre is not on a target's ink"
    counts = [len({pieces.find(i) for i in np.flatnonzero(owner == k)}) for k in range(2)]
    return pieces.find(markers[0]) == pieces.find(markers[1]), counts


def check_drawing(sample, settings: PathfinderSettings) -> None:
    """The paddles the sample lists are two chains whose ends carry the markers as the label says, and the
    markers are where the image shows them."""
    length, margin = settings.paddle_length, sample.margin
    for ends in sample.contours:  # chains of L-px paddles with gaps of about 2m (ceil and floor add up to 3)
        assert ends.shape == (settings.contour_length, 2, 2)
        assert np.allclose(np.linalg.norm(ends[:, 1] - ends[:, 0], axis=1), length)
        assert np.linalg.norm(ends[1:, 0] - ends[:-1, 1], axis=1).max() <= 2 * margin + 3
    seeds = [tuple(ends[0, 0]) for ends in sample.contours]
    lasts = [tuple(ends[-1, 1]) for ends in sample.contours]
    first, last = tuple(sample.markers[0].astype(float)), tuple(sample.markers[1].astype(float))
    assert first in seeds and last in lasts, "a marker is not on a target's end"
    assert (seeds.index(first) == lasts.index(last)) == (sample.label == 1), "the markers' ends disagree with the label"
    assert segment_distances(points_along(sample.contours[0]), sample.contours[1]).min() > 0.5, "the targets cross"
    assert find_markers(sample.image, settings) == {tuple(marker) for marker in sample.markers.tolist()}, "markers drawn elsewhere"


@pytest.mark.slow
@pytest.mark.parametrize(("resolution", "difficulty", "count"), CONNECTIVITY)
def test_a_positive_joins_its_markers_through_one_contour_and_a_negative_does_not(resolution, difficulty, count):
    settings = pathfinder_settings(resolution, difficulty)
    drawn = samples(resolution, difficulty, count)
    level = threshold(sample.image for sample in drawn)
    for number, sample in enumerate(drawn):
        check_drawing(sample, settings)
        joined, pieces = through_ink(sample, settings, level, find_markers(sample.image, settings))
        assert pieces == [1, 1], f"image {number}: a target's ink is broken into {pieces} pieces"
        assert joined == (sample.label == 1), f"image {number}: label {sample.label}, markers joined {joined}"


@pytest.mark.slow
@pytest.mark.parametrize("resolution", [64, 128])
def test_hard_targets_need_many_draws_and_still_connect(resolution):
    """At 64 and 128 px the two 14-paddle targets rarely both grow in full (about one draw in a thousand);
    the drawing in batches keeps that affordable, and its images are as the others."""
    settings = pathfinder_settings(resolution, "hard")
    drawn = samples(resolution, "hard", 64)
    level = threshold(sample.image for sample in drawn)
    for sample in drawn:
        check_drawing(sample, settings)
        assert through_ink(sample, settings, level, find_markers(sample.image, settings)) == (sample.label == 1, [1, 1])


@pytest.mark.parametrize(("resolution", "difficulty", "count"), [(32, "hard", 200), (256, "easy", 100)])
def test_labels_are_fair_coins_and_the_images_look_like_the_release(resolution, difficulty, count):
    settings = pathfinder_settings(resolution, difficulty)
    drawn = samples(resolution, difficulty, count, seed=1)
    positives = sum(sample.label for sample in drawn)
    assert abs(positives - count / 2) <= 4 * math.sqrt(count / 4)  # 4 standard deviations of a binomial
    images = np.stack([sample.image for sample in drawn])
    assert (images.reshape(count, -1).max(axis=1) == 255).all()  # each scaled to its brightest pixel
    ink = (images > 0).mean(axis=(1, 2))
    low, high = {32: (0.08, 0.25), 256: (0.004, 0.03)}[resolution]  # measured means: 0.16 and 0.012
    assert low < ink.mean() < high and (ink > 0).all()
    drawn_distractors = [len(sample.distractors) for sample in drawn]
    assert max(drawn_distractors) <= settings.distractors and np.mean(drawn_distractors) > 0.8 * settings.distractors
    assert all(len(d) == settings.distractor_length for sample in drawn for d in sample.distractors)


def test_the_seed_fixes_the_images():
    settings = pathfinder_settings(32, "easy")
    a, b = pathfinder_images(settings, 70, seed=5), pathfinder_images(settings, 70, seed=5)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    other = pathfinder_images(settings, 70, seed=6)
    assert (other[0] != a[0]).any(axis=(1, 2)).all()
    split = pathfinder_images(settings, 70, seed=5, split=1)
    assert (split[0] != a[0]).any(axis=(1, 2)).all()


def test_lra_settings_per_resolution_and_difficulty():
    hard32, path_x = pathfinder_settings(32, "hard"), pathfinder_settings(128, "hard")
    assert (hard32.paddle_length, hard32.paddle_thickness, hard32.paddle_margins, hard32.seed_distance) == (2, 0.5, (1,), 7)
    assert (hard32.target_contrast, hard32.distractor_contrast, hard32.continuity, hard32.padding) == (1.5, 2.0, 1.0, 1)
    assert (path_x.paddle_margins, path_x.marker_radius, path_x.paddle_thickness, path_x.continuity) == ((2, 3), 3.0, 1.5, 1.8)
    assert pathfinder_settings(256, "hard").padding == 22 and pathfinder_settings(256, "easy").seed_distance == 27
    counts = {}
    for resolution in (32, 64, 128, 256):
        drawn = [pathfinder_settings(resolution, difficulty) for difficulty in ("easy", "intermediate", "hard")]
        counts[resolution] = [(s.contour_length, s.distractor_length, s.distractors) for s in drawn]
    assert counts[32] == [(6, 2, 10), (9, 3, 6), (14, 4, 5)]
    assert [n for *_, n in counts[64]] == [11, 8, 5] and [n for *_, n in counts[128]] == [18, 12, 8]
    assert [n for *_, n in counts[256]] == [15, 10, 7]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: pathfinder_settings(48), r"resolution must be one of \[32, 64, 128, 256\], got 48"),
        (lambda: pathfinder_settings(32, "medium"), r"difficulty must be one of \['easy', 'intermediate', 'hard'\], got 'medium'"),
        (lambda: pathfinder_settings(True), "resolution must be one of"),
        (lambda: PathfinderSettings(**{**vars(pathfinder_settings()), "antialias_scale": 12}), "antialias_scale must be an integer in"),
        (lambda: PathfinderSettings(**{**vars(pathfinder_settings()), "paddle_margins": ()}), "paddle_margins must hold"),
        (lambda: PathfinderSettings(**{**vars(pathfinder_settings()), "seed_distance": 16}), "leave no room for the first seed"),
        (lambda: PathfinderSettings(**{**vars(pathfinder_settings()), "continuity": 0}), "continuity must be a finite number > 0"),
        (lambda: load_data("pathfinder-gen:resolution=100", 0), "resolution must be one of"),
        (lambda: load_data("pathfinder-gen:/data", 0), "is generated and reads no directory"),
        (lambda: load_data("pathfinder-gen:train=0", 0), "pathfinder-gen train must be an integer >= 1"),
        (lambda: load_data("pathfinder-gen:colour=1", 0), "unknown options"),
    ],
)
def test_bad_settings_are_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_targets_that_cannot_grow_are_an_error_not_an_endless_loop(monkeypatch):
    monkeypatch.setattr(module, "MAX_TARGET_DRAWS", 64)
    settings = PathfinderSettings(**{**vars(pathfinder_settings(32, "easy")), "contour_length": 60})  # 240 px in a 32 px image
    with pytest.raises(RuntimeError, match="no two target contours grew in 64 draws"):
        PathfinderGenerator(settings).draw(2, np.random.default_rng(0))


def test_the_source_gives_pixel_tokens_on_a_grid_and_is_cached(tmp_path, monkeypatch):
    """Fails if the cache is not read on the second load (it would draw again) or not keyed by the seed."""
    monkeypatch.setenv("TOKENMIX_CACHE", str(tmp_path))
    data = load_data("pathfinder-gen:train=64:val=16:test=16", 0, seed=3)
    assert (data.vocab_size, data.num_classes, data.grid) == (256, 2, (32, 32))
    assert [len(data.split(name)) for name in ("train", "val", "test")] == [64, 16, 16]
    assert data.train.tokens.dtype == torch.uint8 and (data.train.lengths() == 1024).all()
    assert data.source == "pathfinder-gen:resolution=32:difficulty=hard:train=64:val=16:test=16"
    images, labels = pathfinder_images(pathfinder_settings(32, "hard"), 16, seed=3, split=1)  # val: split 1, row by row
    assert torch.equal(data.val.tokens, torch.from_numpy(images.reshape(-1))) and torch.equal(data.val.labels, torch.from_numpy(labels))
    (entry,) = (tmp_path / "pathfinder-gen").iterdir()
    monkeypatch.setattr(module, "pathfinder_images", lambda *a, **k: pytest.fail("drew again instead of reading the cache"))
    again = load_data("pathfinder-gen:train=64:val=16:test=16", 0, seed=3)
    assert torch.equal(again.train.tokens, data.train.tokens) and torch.equal(again.test.labels, data.test.labels)
    with pytest.raises(pytest.fail.Exception, match="drew again"):
        load_data("pathfinder-gen:train=64:val=16:test=16", 0, seed=4)
    assert len(list((tmp_path / "pathfinder-gen").iterdir())) == 1 and entry.exists()


def test_a_2d_model_trains_on_it(tmp_path, capsys):
    data = "pathfinder-gen:train=16:val=8:test=8"
    common = ["--task", "classify", "--data", data, "--dim", "16", "--depth", "1", "--batch-size", "4", "--eval-every", "2"]
    assert main(["train", "--model", "tnn2d", *common, "--steps", "2", "--out", str(tmp_path / "run")]) == 0
    assert "validation: loss" in capsys.readouterr().out
