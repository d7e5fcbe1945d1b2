"""``pathfinder-gen``: Pathfinder images generated as Linsley et al. 2018 draw them (NeurIPS, "Learning long-range
spatial dependencies with horizontal gated recurrent units"), at the Long Range Arena's settings (Tay et al. 2020,
arXiv 2011.04006): are the two markers the ends of one dashed contour? Written from a description of the
public generator's procedure (drewlinsley/pathfinder, ``snakes.py``, ``snakes2.py``), not from its code.

An image (W x W) holds two *target* contours of ``contour_length`` paddles, grown together from seeds
``seed_distance`` apart, and distractor contours of ``distractor_length`` paddles. A paddle is a segment
``paddle_length`` (L) px long and ``paddle_thickness`` (t) wide. A contour moves its pivot L + 2m px along its
last direction (m the paddle margin, drawn per image), and the next paddle covers [m, L + m] px from the new
pivot toward a head drawn among the integer points of the circle of radius L + m, with weight
cos²(continuity · δ) (δ the turn; zero from 90° / continuity on) times 1 - D, D the occupancy dilated by a
disc of radius m. The occupancy holds every paddle grown by m (the mask, m + t/2 around the segment), the
``padding`` px border included; a paddle whose mask and the occupancy overlap fully somewhere (sum >= 1.8) is
refused, its own contour's previous paddle excepted. So gaps within a contour are about 2m px, and
contours stay about 2m px apart: a gap and the clearance between contours are of one size, and only a
contour's smoothness tells them apart (at 32 px, 1 px apart or less happens). A paddle has 3 tries from one
weight vector; a dead end (total weight < 1e-4) fails at once. The two targets are drawn again from new
seeds until both grow in full (as the reference; here at most ``MAX_TARGET_DRAWS`` times); a distractor that
fails 5 times is dropped.

Seeds: the first target's seed paddle (a whole-degree orientation, then its tail) lies with its core (the
pixels its mask covers fully) inside the square 2 · seed_distance px from every edge; the second's tail is
seed_distance px away in a whole-degree direction. A distractor's tail is uniform among the pixels whose
core meets only free pixels (occupancy <= 0.3) inside a 1-px frame, and it fails when under 1 % of the
pixels are free. A seed whose head or pivot falls outside the image is a failed try.

Markers: discs of ``marker_radius`` on contour ends; label 1: the seed end and the last end of one target;
label 0: the seed end of one and the last end of the other (the label and the target are fair coins).
Everything is composed by a pixel-wise max, and each image is scaled so its brightest pixel is 255 (uint8,
rounded half up), as the release's PNGs (``scipy.misc.imsave``). Target paddles peak at ``target_contrast``,
distractors at ``distractor_contrast``, markers at 1.

Rendering, in place of the reference's PIL lines and Lanczos downsampling: each paddle, mask and marker is
sampled at ``antialias_scale``² points per pixel (offsets (k + 1/2) / aa - 1/2) and a pixel holds the
fraction of its points inside. A paddle is the rectangle of width t from its start for L px (flat caps half
a sub-pixel beyond each end, as PIL's inclusive line; the width half-open, so a line t · aa points wide
covers exactly that many); its mask, the points within m + t/2 of the segment; a marker, the disc. Not
reproduced: the Lanczos ringing, the markers' offset of (aa - 1) / (2 aa) px up and left, and the reference's
lagged occupancy (the second target tested without the first's newest paddle, the first target's last
paddle never marked, the second seed never tested): here a paddle is tested against every paddle of the
other contours, so the targets never cross.

``pathfinder_settings(resolution, difficulty)`` gives the LRA's values; ``PathfinderGenerator(settings)
.draw(count, rng)`` gives ``PathfinderSample``s (the image and what a test needs: label, marker centres,
every paddle's ends); ``pathfinder_images`` draws many in chunks, each from its own seeded generator;
``load_pathfinder_gen`` is the ``--data`` task, cached on disk (``cache.py``) by its options, the seed and
``GENERATOR_VERSION``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

import numpy as np

from ..io.progress import progress_bar
from ..validation import check_int, check_number
from .cache import cache_directory, cache_key, load_examples, store_examples
from .corpus import BYTE_VOCAB, SPLITS
from .examples import ClassificationData, Examples

NAME = "pathfinder-gen"
GENERATOR_VERSION = "1"  # bumped when the images drawn for given options change (invalidates cached tasks)
RESOLUTIONS = (32, 64, 128, 256)
DIFFICULTIES = {"easy": 6, "intermediate": 9, "hard": 14}  # LRA's names for curv_baseline, curv_contour_length_{9,14}
PADDLE_TRIES = 3  # max_paddle_retrial 2, plus the first
DISTRACTOR_TRIES = 5  # max_distractor_contour_retrial 4, plus the first
MAX_TARGET_DRAWS = 1_000_000  # per image; the reference retries the two targets without end
FREE = 0.3  # occupancy at most this is free
COLLISION = 1.8  # a paddle is refused where its mask plus the occupancy reaches this
MIN_WEIGHT = 1e-4  # a total candidate weight below this is a dead end
MIN_FREE_FRACTION = 0.01  # a distractor fails when fewer pixels are free
SEED_DRAWS = 64  # tails drawn at once for a distractor before every free pixel is tested
MAX_BATCH_BYTES = 32 << 20  # occupancies of the target draws run side by side
FIRST_BATCH = 16  # target draws per image at first, doubled while none succeeds
CHUNK = 64  # images drawn side by side, each chunk from its own generator
OPTIONS = ("resolution", "difficulty", "train", "val", "test")
EPSILON = 1e-9  # keeps sub-pixel points on a shape's edge from flipping with rounding
DEGREES = 360  # seed orientations are whole degrees; orientation rows past these are candidate directions


@dataclass(frozen=True)
class PathfinderSettings:
    """Generator parameters (the reference's names in brackets); lengths in pixels of the final image."""

    resolution: int  # window_size
    contour_length: int  # paddles per target contour
    distractor_length: int  # paddles per distractor contour
    distractors: int  # distractor contours attempted (num_distractor_snakes, rounded up)
    padding: int  # border marked occupied
    antialias_scale: int  # sub-pixel samples per pixel side
    paddle_margins: tuple[int, ...]  # paddle_margin_list: m, one drawn per image
    seed_distance: int  # between the two targets' seeds
    marker_radius: float
    paddle_length: int
    paddle_thickness: float
    continuity: float  # cos²(continuity · turn) turning weights
    target_contrast: float  # paddle_contrast x snake_contrast: a target paddle's peak before scaling
    distractor_contrast: float  # snake_contrast

    def __post_init__(self):
        check_int(self.resolution, "pathfinder resolution", minimum=8)
        for name in ("contour_length", "distractor_length", "paddle_length"):
            check_int(getattr(self, name), f"pathfinder {name}")
        check_int(self.antialias_scale, "pathfinder antialias_scale", maximum=11)  # two masks' point counts fit a uint8
        for name in ("distractors", "padding", "seed_distance"):
            check_int(getattr(self, name), f"pathfinder {name}", minimum=0)
        if not self.paddle_margins:
            raise ValueError("pathfinder paddle_margins must hold at least one margin, got ()")
        for margin in self.paddle_margins:
            check_int(margin, "pathfinder paddle_margins entry")
        for name in ("marker_radius", "paddle_thickness", "continuity", "target_contrast", "distractor_contrast"):
            check_number(getattr(self, name), f"pathfinder {name}", minimum=0, open_minimum=True)
        if 2 * max(self.seed_distance, self.padding) >= self.resolution:
            raise ValueError(
                f"pathfinder seed_distance ({self.seed_distance}) and padding ({self.padding}) leave no room for the "
                f"first seed at resolution {self.resolution}: need 2 x max of them < resolution"
            )


@dataclass(frozen=True)
class _Resolution:
    padding: int
    margins: tuple[int, ...]
    seed_distance: int
    marker_radius: float
    paddle_length: int
    paddle_thickness: float
    continuity: float
    snake_contrast: float
    paddle_contrast: float
    distractor_paddles: int  # the N of num_distractor_snakes = N / distractor_length


# The LRA's values (lra_benchmarks/data/pathfinder.py docstrings of Pathfinder32/64/128/256); where one is
# not listed the generator's default: padding 22 and seed_distance 27 at 256, paddle_length 5 at 64-256.
LRA = {
    32: _Resolution(1, (1,), 7, 1.5, 2, 0.5, 1.0, 2.0, 0.75, 20),
    64: _Resolution(1, (1,), 12, 2.5, 5, 1.0, 1.8, 0.8, 1.0, 22),
    128: _Resolution(1, (2, 3), 20, 3.0, 5, 1.5, 1.8, 0.9, 1.0, 35),
    256: _Resolution(22, (3,), 27, 5.0, 5, 2.0, 1.8, 1.0, 1.0, 30),
}
ANTIALIAS = 2


def distractor_rule(resolution: int, contour_length: int) -> tuple[int, int]:
    """(distractor_length, distractors attempted) for a difficulty.

    LRA lists the rule for contour length 14 only: distractor_length = cl // 3 at 32 (cl / 3 elsewhere) and
    num_distractor_snakes = 20 // dl at 32, 22 / dl, 35 / dl and 30 / dl at 64, 128 and 256. Read here, as the
    most likely: both recomputed from each difficulty's contour length; the paddle count truncated (cl // 3:
    a fractional length cannot be drawn, and 32 writes //), the count of contours with true division from
    cl / 3 (the 128 metadata's ``2.0`` shows Python 3), attempted while fewer than it, so rounded up. This
    gives 10 / 6 / 5 contours at 32, 11 / 8 / 5 at 64, 18 / 12 / 8 at 128 and 15 / 10 / 7 at 256 for
    easy / intermediate / hard. Not settled by public sources: 5 paddles instead of 4 at cl 14, Python 2's
    floor division (64: 11 / 7 / 5, 128: 17 / 11 / 8), the baseline count at every difficulty (the original
    script's flow), or twice the count at 128 (a third-party note citing LRA issue #38).
    """
    budget = LRA[resolution].distractor_paddles
    if resolution == 32:
        return contour_length // 3, budget // (contour_length // 3)
    return contour_length // 3, math.ceil(budget / (contour_length / 3) - EPSILON)


def pathfinder_settings(resolution: int = 32, difficulty: str = "hard") -> PathfinderSettings:
    """The LRA's settings at ``resolution`` (32, 64, 128 = Path-X, 256) and ``difficulty`` (easy,
    intermediate, hard: contour length 6, 9, 14)."""
    if resolution not in RESOLUTIONS or isinstance(resolution, bool):
        raise ValueError(f"pathfinder resolution must be one of {list(RESOLUTIONS)}, got {resolution!r}")
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"pathfinder difficulty must be one of {list(DIFFICULTIES)}, got {difficulty!r}")
    values, contour_length = LRA[resolution], DIFFICULTIES[difficulty]
    distractor_length, distractors = distractor_rule(resolution, contour_length)
    return PathfinderSettings(
        resolution=resolution,
        contour_length=contour_length,
        distractor_length=distractor_length,
        distractors=distractors,
        padding=values.padding,
        antialias_scale=ANTIALIAS,
        paddle_margins=values.margins,
        seed_distance=values.seed_distance,
        marker_radius=values.marker_radius,
        paddle_length=values.paddle_length,
        paddle_thickness=values.paddle_thickness,
        continuity=values.continuity,
        target_contrast=values.paddle_contrast * values.snake_contrast,
        distractor_contrast=values.snake_contrast,
    )


@dataclass
class PathfinderSample:
    """One image and how it was drawn. ``markers``: (2, 2) int centres (row, col), the first on a target's
    seed end; ``contours``: the two targets' paddles, each (contour_length, 2, 2) float with every paddle's
    (near end, far end) along the contour, so ``contours[k][0, 0]`` is its seed end and ``contours[k][-1, 1]``
    its last end; ``distractors``: the same for each distractor drawn."""

    image: np.ndarray  # (W, W) uint8
    label: int
    markers: np.ndarray
    contours: tuple[np.ndarray, np.ndarray]
    distractors: list[np.ndarray]
    margin: int


def _sample_points(half: int, aa: int) -> np.ndarray:
    """Sub-pixel points of a (2 half + 1)² window centred on pixel (0, 0): (2, S·aa, S·aa) (row, col)."""
    offsets = (np.arange(aa) + 0.5) / aa - 0.5
    line = (np.arange(-half, half + 1)[:, None] + offsets).reshape(-1)
    return np.stack(np.meshgrid(line, line, indexing="ij"))


def _counts(inside: np.ndarray, aa: int) -> np.ndarray:
    """How many of each pixel's aa² points are inside: (..., S·aa, S·aa) bool -> (..., S, S) uint8."""
    *lead, rows, columns = inside.shape
    return inside.reshape(*lead, rows // aa, aa, columns // aa, aa).sum(axis=(-3, -1), dtype=np.uint8)


def _paddle_stamps(vectors: np.ndarray, half: int, aa: int, thickness: float, reach: float) -> tuple[np.ndarray, np.ndarray]:
    """Ink and mask point counts (n, S, S) of segments from pixel (0, 0) along each of ``vectors`` (n, 2): ink,
    the rectangle of width ``thickness`` (caps half a sub-pixel beyond the ends); mask, within ``reach``."""
    points = _sample_points(half, aa)[None]  # (1, 2, P, P)
    length = np.linalg.norm(vectors, axis=1)
    unit = (vectors / length[:, None])[:, :, None, None]
    along = points[:, 0] * unit[:, 0] + points[:, 1] * unit[:, 1]
    across = points[:, 1] * unit[:, 0] - points[:, 0] * unit[:, 1]
    cap, extent = 0.5 / aa + EPSILON, length[:, None, None]
    ink = (along >= -cap) & (along <= extent + cap) & (across >= -thickness / 2 - EPSILON) & (across < thickness / 2 - EPSILON)
    nearest = np.clip(along, 0, extent)  # distance to the segment
    distance = np.hypot(points[:, 0] - nearest * unit[:, 0], points[:, 1] - nearest * unit[:, 1])
    return _counts(ink, aa), _counts(distance <= reach + EPSILON, aa)


def _disc_offsets(radius: float) -> np.ndarray:
    """Integer (row, col) offsets within ``radius`` of the origin, (n, 2)."""
    span = int(math.floor(radius))
    rows, columns = np.mgrid[-span : span + 1, -span : span + 1]
    keep = rows**2 + columns**2 <= radius**2 + EPSILON
    return np.stack([rows[keep], columns[keep]], axis=1)


def _support(entries: np.ndarray, keep: np.ndarray, values: np.ndarray, repeat: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``keep`` (rows, K): the ``entries`` (K,) it keeps and their ``values`` (rows, K), padded to
    one width with the row's last kept entry, valued as it (``repeat``: a repeat changes no max and writes the
    same value twice) or 0 (adds nothing to a sum). A row keeping nothing gets entry 0 valued 0."""
    width = max(1, int(keep.sum(axis=1).max()))
    kept, valued = np.zeros((len(keep), width), entries.dtype), np.zeros((len(keep), width), values.dtype)
    for row, (chosen, value) in enumerate(zip(keep, values, strict=True)):
        index = np.flatnonzero(chosen)
        if index.size:
            kept[row] = entries[np.pad(index, (0, width - index.size), mode="edge")]
            valued[row] = value[index[-1]] if repeat else 0
            valued[row, : index.size] = value[index]
    return kept, valued


class _Geometry:
    """Tables for one settings and margin on a padded canvas ``stride`` px wide (pixels as flat indices):
    the candidate heads on the circle of radius L + m, the orientation rows (whole degrees for seeds, then
    each candidate's direction) with their turning weights and pivot steps, every paddle's ink and mask."""

    def __init__(self, settings: PathfinderSettings, margin: int, stride: int):
        length, aa, thickness = settings.paddle_length, settings.antialias_scale, settings.paddle_thickness
        radius = length + margin
        # candidate heads: points at angles k · 360° / (2π R) on the circle, truncated, once each
        angles = np.radians(np.arange(0.0, 360.0, 360.0 / (2 * np.pi * radius)))
        points = np.floor(radius * np.stack([np.sin(angles), np.cos(angles)], axis=1) + EPSILON).astype(np.int64)
        heads = np.unique(points, axis=0)
        directions = np.arctan2(heads[:, 0], heads[:, 1])
        theta = np.concatenate([np.radians(np.arange(DEGREES)), directions])
        unit = np.stack([np.sin(theta), np.cos(theta)], axis=1)
        turn = np.abs((directions[None, :] - theta[:, None] + np.pi) % (2 * np.pi) - np.pi)
        weights = np.cos(np.minimum(settings.continuity * turn, np.pi / 2)) ** 2  # (rows, K)
        flat = np.array([stride, 1])
        heads = heads @ flat
        # per row only the candidates it can turn to: (rows, J), padded with weight 0
        self.options, self.option_weights = _support(np.arange(len(heads)), weights > EPSILON, weights, repeat=False)
        self.option_heads = heads[self.options]
        self.option_discs = self.option_heads[..., None] + _disc_offsets(margin) @ flat  # (rows, J, disc): D around each
        self.step = np.ceil((length + 2 * margin) * unit - EPSILON).astype(np.int64) @ flat  # pivot -> next pivot
        seed_head = np.ceil(length * unit[:DEGREES] - EPSILON).astype(np.int64)  # seed tail -> its head
        self.seed_head, self.seed_pivot = seed_head, seed_head + np.ceil(-radius * unit[:DEGREES] - EPSILON).astype(np.int64)
        self.half = int(math.ceil(length + margin + thickness / 2 + 1))
        span = np.arange(-self.half, self.half + 1)
        window = (span[:, None] * stride + span).reshape(-1)  # a stamp's pixels around its centre
        # seed paddles go from their tail along theta; grown ones from their head back toward the pivot
        vectors = np.concatenate([length * unit[:DEGREES], -length * unit[DEGREES:]])
        ink, mask = _paddle_stamps(vectors, self.half, aa, thickness, margin + thickness / 2)
        ink, flat_mask = ink.reshape(len(theta), -1), mask.reshape(len(theta), -1)
        # each stamp as the flat offsets of its nonzero pixels and their values; "hit": where a mask can reach
        # the collision sum (the occupancy is at most aa²)
        self.ink_at, ink_counts = _support(window, ink > 0, ink)
        self.ink = ink_counts.astype(np.float32) / aa**2
        self.mask_at, self.mask = _support(window, flat_mask > 0, flat_mask)
        self.hit_at, self.hit = _support(window, flat_mask + aa**2 >= COLLISION * aa**2, flat_mask)
        core = [np.argwhere(m == aa**2) - self.half for m in mask[:DEGREES]]  # pixels a seed mask covers fully
        self.core_low = np.array([pixels.min(axis=0) for pixels in core])
        self.core_high = np.array([pixels.max(axis=0) for pixels in core])
        widest = max(len(pixels) for pixels in core)  # flat offsets, padded with the tail (always in the core)
        self.cores = np.array([np.pad(pixels @ flat, (0, widest - len(pixels))) for pixels in core])
        self.near = np.concatenate([np.zeros((DEGREES, 2)), vectors[DEGREES:]])  # near end - start, per row
        self.far = np.concatenate([vectors[:DEGREES], np.zeros((len(directions), 2))])  # far end - start


def _marker_half(settings: PathfinderSettings) -> int:
    """Half the side of a marker's stamp."""
    return int(math.ceil(settings.marker_radius + 1))


@dataclass
class _Contours:
    """``count`` contours grown side by side in each of many attempts: per contour and attempt, the pivot,
    the last orientation row and every paddle so far (start pixel, row); ``alive``: attempts not failed."""

    pivot: np.ndarray  # (count, attempts) flat pixel
    row: np.ndarray  # (count, attempts)
    starts: np.ndarray  # (count, attempts, paddles)
    rows: np.ndarray  # (count, attempts, paddles)
    alive: np.ndarray  # (attempts,) bool

    @classmethod
    def empty(cls, count: int, attempts: int, paddles: int) -> _Contours:
        pivot, row = (np.zeros((count, attempts), np.int64) for _ in range(2))
        starts, rows = (np.zeros((count, attempts, paddles), np.int64) for _ in range(2))
        return cls(pivot, row, starts, rows, np.zeros(attempts, bool))


class _Grower:
    """Contours grown side by side as arrays, for one ``PathfinderSettings``: pixels are flat indices into a
    canvas padded by ``pad`` px (zero outside the image), so stamps near the border need no clipping, and an
    occupancy holds point counts (0 .. aa²) in uint8, one row per attempt. Tables are built once per margin."""

    def __init__(self, settings: PathfinderSettings):
        self.settings = settings
        size, aa = settings.resolution, settings.antialias_scale
        reach = max(2 * settings.paddle_length + 4 * m + 4 for m in settings.paddle_margins)  # a pivot's candidates, dilated
        half = max(int(math.ceil(settings.paddle_length + m + settings.paddle_thickness / 2 + 1)) for m in settings.paddle_margins)
        self.pad = max(half, reach, _marker_half(settings)) + 1
        self.stride = size + 2 * self.pad
        self.area = self.stride**2
        self.geometry = {margin: _Geometry(settings, margin, self.stride) for margin in settings.paddle_margins}
        self.points, self.free, self.collision = aa**2, FREE * aa**2, COLLISION * aa**2
        grid = np.zeros((self.stride, self.stride), dtype=np.uint8)
        image = grid[self.pad : self.pad + size, self.pad : self.pad + size]
        image[...] = 1
        self.inside = grid.reshape(-1).copy()
        self.pixels = np.flatnonzero(self.inside)
        image[[0, -1]], image[:, [0, -1]] = 0, 0
        self.interior = grid.reshape(-1).copy()  # inside the 1-px frame: where a distractor's seed core may lie
        self.interior_pixels = np.flatnonzero(self.interior)
        b = settings.padding
        image[...] = 0
        image[:b], image[size - b :], image[:, :b], image[:, size - b :] = aa**2, aa**2, aa**2, aa**2
        self.empty = grid.reshape(-1).copy()  # the occupancy before any paddle: the border
        self.cap = max(64, MAX_BATCH_BYTES // (2 * self.area))  # target attempts at once

    def _flat(self, pixels: np.ndarray) -> np.ndarray:
        """Flat canvas indices of image pixels (n, 2) (row, col)."""
        return (pixels[:, 0] + self.pad) * self.stride + pixels[:, 1] + self.pad

    def _seed_fits(self, geometry: _Geometry, tail: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Whether each seed's head and pivot lie inside the image (tail (n, 2), rows (n,))."""
        ends = np.stack([tail + geometry.seed_head[rows], tail + geometry.seed_pivot[rows]], axis=1)
        return ((ends >= 0) & (ends < self.settings.resolution)).all(axis=(1, 2))

    def _place(self, contours: _Contours, k: int, attempts, tail, rows, geometry: _Geometry) -> None:
        """Contour ``k``'s seed paddle in ``attempts``, which are then alive."""
        start = self._flat(tail)
        contours.starts[k, attempts, 0], contours.rows[k, attempts, 0] = start, rows
        contours.pivot[k, attempts], contours.row[k, attempts] = self._flat(tail + geometry.seed_pivot[rows]), rows
        contours.alive[attempts] = True

    def _grow(self, geometry: _Geometry, contours: _Contours, occupancy: np.ndarray, rng) -> None:
        """Adds paddles to every contour in turn until each has its full count; an attempt dies at its first
        failure. ``occupancy[k]`` (attempts, pixels), contour k's, holds every paddle but k's newest: a new
        paddle goes into the others', the one it follows into k's."""
        count, _, length = contours.starts.shape
        for step in range(1, length):
            for k in range(count):
                alive = np.flatnonzero(contours.alive)
                if not alive.size:
                    return
                grown, heads, rows, pivots = self._extend(geometry, occupancy[k], contours, k, alive, rng)
                contours.alive[alive[~grown]] = False
                alive = alive[grown]
                self._mark(occupancy[k], alive, contours.starts[k, alive, step - 1], contours.rows[k, alive, step - 1], geometry)
                for other in range(count):
                    if other != k:
                        self._mark(occupancy[other], alive, heads, rows, geometry)
                contours.starts[k, alive, step], contours.rows[k, alive, step] = heads, rows
                contours.pivot[k, alive], contours.row[k, alive] = pivots, rows

    def _extend(self, geometry: _Geometry, occupancy: np.ndarray, contours: _Contours, k: int, alive: np.ndarray, rng):
        """The next paddle of contour ``k`` in each ``alive`` attempt: (grown, its head, its row, the new pivot),
        the last three for the grown ones; not grown at a dead end or after 3 collisions."""
        attempts, pixels = occupancy.shape
        rows = contours.row[k, alive]
        pivot = contours.pivot[k, alive] + geometry.step[rows]
        dilated = occupancy.reshape(-1)[(alive * pixels + pivot)[:, None, None] + geometry.option_discs[rows]].max(axis=2)  # D, (n, J)
        heads = pivot[:, None] + geometry.option_heads[rows]
        cumulative = np.cumsum(geometry.option_weights[rows] * self.inside[heads] * (self.points - dilated), axis=1)
        total = cumulative[:, -1]
        chosen = np.full(len(alive), -1)
        pending = np.flatnonzero(total >= MIN_WEIGHT * self.points)
        for _ in range(PADDLE_TRIES):
            if not pending.size:
                break
            drawn = rng.random(attempts)[alive[pending]] * total[pending]
            option = (cumulative[pending] <= drawn[:, None]).sum(axis=1)  # inverse CDF
            candidate = DEGREES + geometry.options[rows[pending], option]
            clash = self._collides(occupancy, alive[pending], heads[pending, option], candidate, geometry)
            chosen[pending[~clash]] = option[~clash]
            pending = pending[clash]
        grown = np.flatnonzero(chosen >= 0)
        option = chosen[grown]
        return chosen >= 0, heads[grown, option], DEGREES + geometry.options[rows[grown], option], pivot[grown]

    def _collides(self, occupancy: np.ndarray, attempts, starts, rows, geometry: _Geometry) -> np.ndarray:
        """Whether each paddle (start pixel, row) and its attempt's occupancy reach the collision sum."""
        window = occupancy.reshape(-1)[(attempts * occupancy.shape[1] + starts)[:, None] + geometry.hit_at[rows]]
        return (window + geometry.hit[rows]).max(axis=1) >= self.collision

    def _mark(self, occupancy: np.ndarray, attempts, starts, rows, geometry: _Geometry) -> None:
        """Paddles' masks into their attempts' occupancies (pixel-wise max); one paddle per attempt."""
        flat = occupancy.reshape(-1)
        where = (attempts * occupancy.shape[1] + starts)[:, None] + geometry.mask_at[rows]
        flat[where] = np.maximum(flat[where], geometry.mask[rows])


class PathfinderGenerator(_Grower):
    """Draws ``PathfinderSample``s, many images side by side. The two targets of an image are drawn in batches
    of attempts (16, then doubling, within a memory cap) and its first attempt that succeeds is kept: attempts
    are independent, so this is the reference's drawing again until success, and settings that need
    thousands of draws (64 and 128 px, hard) cost array operations rather than Python steps. The i-th
    distractor of every image is tried together, up to 5 times.
    """

    def __init__(self, settings: PathfinderSettings):
        super().__init__(settings)
        aa, marker = settings.antialias_scale, _marker_half(settings)
        points = _sample_points(marker, aa)
        disc = _counts(np.hypot(points[0], points[1]) <= settings.marker_radius + EPSILON, aa).astype(np.float32) / aa**2
        span = np.arange(-marker, marker + 1)
        self.marker, self.marker_window = disc.reshape(-1), (span[:, None] * self.stride + span).reshape(-1)

    def draw(self, count: int, rng: np.random.Generator) -> list[PathfinderSample]:
        """``count`` images: labels, margins and which target carries the seed-end marker first, then per
        margin the targets, the distractors and the image."""
        settings = self.settings
        labels = rng.integers(2, size=count)
        margins = rng.integers(len(settings.paddle_margins), size=count)
        firsts = rng.integers(2, size=count)
        samples = [None] * count
        for which, margin in enumerate(settings.paddle_margins):
            group = np.flatnonzero(margins == which)
            if not group.size:
                continue
            geometry = self.geometry[margin]
            occupancy, starts, rows = self._targets(geometry, len(group), rng)
            distractors = self._distractors(geometry, occupancy, rng)
            contours = [[self._ends(geometry, starts[i, k], rows[i, k]) for k in range(2)] for i in range(len(group))]
            markers = np.zeros((len(group), 2, 2), np.int64)
            for i, image in enumerate(group):
                first = firsts[image]
                second = first if labels[image] == 1 else 1 - first
                markers[i] = np.array([contours[i][first][0, 0], contours[i][second][-1, 1]]).round()
            images = self._render(geometry, starts, rows, distractors, markers)
            for i, image in enumerate(group):
                ends = [self._ends(geometry, *paddles) for paddles in distractors[i]]
                samples[image] = PathfinderSample(images[i], int(labels[image]), markers[i], tuple(contours[i]), ends, margin)
        return samples

    # -- the targets -----------------------------------------------------------------------------------------

    def _targets(self, geometry: _Geometry, count: int, rng) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For ``count`` images: the occupancy of both targets (count, pixels) and their paddles' starts and
        rows (count, 2, contour_length), each drawn again until both reach their full length."""
        length = self.settings.contour_length
        occupancy = np.zeros((count, self.area), np.uint8)
        starts, rows = np.zeros((count, 2, length), np.int64), np.zeros((count, 2, length), np.int64)
        waiting, batch, drawn = np.arange(count), np.full(count, FIRST_BATCH), np.zeros(count, np.int64)
        while waiting.size:
            sizes = np.minimum(batch[waiting], self.cap)
            taken = max(1, int(np.searchsorted(np.cumsum(sizes), self.cap, side="right")))
            now, sizes = waiting[:taken], sizes[:taken]
            owner = np.repeat(np.arange(taken), sizes)
            contours, trial = self._target_seeds(geometry, len(owner), rng)
            self._grow(geometry, contours, trial, rng)
            won = np.flatnonzero(contours.alive)
            done, first = np.unique(owner[won], return_index=True)
            win, images = won[first], now[done]
            starts[images], rows[images] = contours.starts[:, win].transpose(1, 0, 2), contours.rows[:, win].transpose(1, 0, 2)
            occupancy[images] = trial[0, win]  # every paddle but the first target's last
            self._mark(occupancy, images, starts[images, 0, -1], rows[images, 0, -1], geometry)
            failed = now[np.setdiff1d(np.arange(taken), done)]
            drawn[now] += sizes
            if (drawn[failed] >= MAX_TARGET_DRAWS).any():
                raise RuntimeError(f"pathfinder: no two target contours grew in {MAX_TARGET_DRAWS} draws with {self.settings}")
            batch[failed] *= 2
            waiting = np.concatenate([failed, waiting[taken:]])
        return occupancy, starts, rows

    def _target_seeds(self, geometry: _Geometry, attempts: int, rng) -> tuple[_Contours, np.ndarray]:
        """Seed paddles of both targets in each of ``attempts`` draws, and the draws' occupancies
        (2, attempts, pixels): the first target's holds the second's seed and the second's the first's."""
        size, distance = self.settings.resolution, self.settings.seed_distance
        edge = max(2 * distance, self.settings.padding)
        contours = _Contours.empty(2, attempts, self.settings.contour_length)
        tails = np.zeros((attempts, 2), np.int64)
        pending = np.arange(attempts)
        for _ in range(PADDLE_TRIES):  # the first: its core inside the square 2 seed_distance from the edges
            rows = rng.integers(DEGREES, size=attempts)[pending]
            low, high = edge - geometry.core_low[rows], size - edge - geometry.core_high[rows]
            room = (high > low).all(axis=1)  # none: the draw fails at once
            pending, rows, low, high = pending[room], rows[room], low[room], high[room]
            tail = low + np.floor(rng.random((attempts, 2))[pending] * (high - low)).astype(np.int64)
            fits = self._seed_fits(geometry, tail, rows)
            self._place(contours, 0, pending[fits], tail[fits], rows[fits], geometry)
            tails[pending[fits]] = tail[fits]
            pending = pending[~fits]
        occupancy = np.broadcast_to(self.empty, (2, attempts, self.area)).copy()
        seeded = np.flatnonzero(contours.alive)
        self._mark(occupancy[1], seeded, contours.starts[0, seeded, 0], contours.rows[0, seeded, 0], geometry)
        contours.alive[:] = False
        pending = seeded
        for _ in range(PADDLE_TRIES):  # the second: seed_distance away in a whole-degree direction
            rows = rng.integers(DEGREES, size=attempts)[pending]
            direction = np.radians(rng.integers(DEGREES, size=attempts)[pending])
            tail = np.round(tails[pending] + distance * np.stack([np.sin(direction), np.cos(direction)], axis=1)).astype(np.int64)
            fits = self._seed_fits(geometry, tail, rows)
            fits[fits] = ~self._collides(occupancy[1], pending[fits], self._flat(tail[fits]), rows[fits], geometry)
            self._place(contours, 1, pending[fits], tail[fits], rows[fits], geometry)
            pending = pending[~fits]
        seeded = np.flatnonzero(contours.alive)
        self._mark(occupancy[0], seeded, contours.starts[1, seeded, 0], contours.rows[1, seeded, 0], geometry)
        return contours, occupancy

    # -- distractors -----------------------------------------------------------------------------------------

    def _distractors(self, geometry: _Geometry, occupancy: np.ndarray, rng) -> list[list]:
        """Per image, its distractors' paddles (starts, rows); each is tried up to 5 times, then dropped."""
        drawn = [[] for _ in range(len(occupancy))]
        for _ in range(self.settings.distractors):
            trying = np.arange(len(occupancy))
            for _ in range(DISTRACTOR_TRIES):
                if not trying.size:
                    break
                grown, starts, rows = self._distractor(geometry, occupancy, trying, rng)
                for image, start, row in zip(trying[grown], starts, rows, strict=True):
                    drawn[image].append((start, row))
                trying = trying[~grown]
        return drawn

    def _distractor(self, geometry: _Geometry, occupancy: np.ndarray, images: np.ndarray, rng):
        """One try of a distractor in each of ``images``: (grown (n,) bool, starts and rows of the grown ones);
        a grown one is marked in its image's occupancy, a failed one leaves it unchanged."""
        attempts = len(images)
        contours = _Contours.empty(1, attempts, self.settings.distractor_length)
        pending = np.arange(attempts)
        for _ in range(PADDLE_TRIES):
            if not pending.size:
                break
            rows = rng.integers(DEGREES, size=attempts)[pending]
            tails, found = self._free_tails(geometry, occupancy[images[pending]], rows, rng)
            fits = found > 0
            fits[fits] = self._seed_fits(geometry, tails[fits], rows[fits])
            self._place(contours, 0, pending[fits], tails[fits], rows[fits], geometry)
            pending = pending[~fits & (found >= 0)]
        work = occupancy[images][None]
        self._grow(geometry, contours, work, rng)
        grown = contours.alive
        index = np.flatnonzero(grown)
        self._mark(work[0], index, contours.starts[0, index, -1], contours.rows[0, index, -1], geometry)
        occupancy[images[index]] = work[0, index]
        return grown, contours.starts[0, index], contours.rows[0, index]

    def _free_tails(self, geometry: _Geometry, occupancy: np.ndarray, rows: np.ndarray, rng) -> tuple[np.ndarray, np.ndarray]:
        """Per image (occupancy (n, pixels)), a seed tail (row, col) uniform among the pixels whose seed core
        (orientation ``rows``) meets only free pixels inside a 1-px frame, and 1 where found, 0 where none
        fits, -1 where under 1 % of the pixels are free (the contour fails). Pixels drawn at random first
        (the first that fits is uniform among those that fit), then every pixel where none of those fit."""
        size, count = self.settings.resolution, len(occupancy)
        cores = geometry.cores[rows]  # (n, C) flat offsets
        enough = (occupancy[:, self.pixels] <= self.free).sum(axis=1) >= MIN_FREE_FRACTION * size * size
        drawn = self.interior_pixels[rng.integers(len(self.interior_pixels), size=(count, SEED_DRAWS))]
        places = drawn[:, :, None] + cores[:, None, :]
        fits = (self.interior[places] > 0) & (occupancy[np.arange(count)[:, None, None], places] <= self.free)
        fits = fits.all(axis=2)
        found = fits.any(axis=1)
        tails = drawn[np.arange(count), fits.argmax(axis=1)]
        for i in np.flatnonzero(enough & ~found):
            places = self.interior_pixels[:, None] + cores[i]
            hits = np.flatnonzero(((self.interior[places] > 0) & (occupancy[i, places] <= self.free)).all(axis=1))
            if hits.size:
                tails[i], found[i] = self.interior_pixels[hits[rng.integers(hits.size)]], True
        tails = np.stack(np.divmod(tails, self.stride), axis=1) - self.pad
        return tails, np.where(enough, found.astype(np.int64), -1)

    # -- the image -------------------------------------------------------------------------------------------

    def _ends(self, geometry: _Geometry, starts: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """(n, 2, 2): each paddle's (near end, far end) along its contour, in image pixels (row, col)."""
        start = np.stack(np.divmod(starts, self.stride), axis=1).astype(np.float64) - self.pad
        return np.stack([start + geometry.near[rows], start + geometry.far[rows]], axis=1)

    def _render(self, geometry: _Geometry, starts, rows, distractors, markers) -> np.ndarray:
        """The images (n, W, W) uint8: the paddles' ink and the markers by pixel-wise max, each scaled so its
        brightest pixel is 255 (rounded half up)."""
        settings, count = self.settings, len(starts)
        base = np.arange(count) * self.area
        starts, rows = (base[:, None, None] + starts).reshape(-1), rows.reshape(-1)
        where = [starts[:, None] + geometry.ink_at[rows]]
        values = [geometry.ink[rows] * np.float32(settings.target_contrast)]
        for i, paddles in enumerate(distractors):
            for start, row in paddles:
                where.append(base[i] + start[:, None] + geometry.ink_at[row])
                values.append(geometry.ink[row] * np.float32(settings.distractor_contrast))
        canvas = np.zeros(count * self.area, dtype=np.float32)
        np.maximum.at(canvas, np.concatenate(where).reshape(-1), np.concatenate(values).reshape(-1))
        at = base[:, None] + (markers[..., 0] + self.pad) * self.stride + markers[..., 1] + self.pad
        np.maximum.at(canvas, (at.reshape(-1, 1) + self.marker_window).reshape(-1), np.tile(self.marker, at.size))
        images = canvas.reshape(count, self.stride, self.stride)[:, self.pad : -self.pad, self.pad : -self.pad]
        peak = images.max(axis=(1, 2), keepdims=True)
        return np.floor(images * (255 / peak) + 0.5).astype(np.uint8)


def pathfinder_samples(settings: PathfinderSettings, count: int, seed: int = 0, split: int = 0, bar=None) -> list[PathfinderSample]:
    """``count`` ``PathfinderSample``s drawn ``CHUNK`` at a time, chunk j from
    ``numpy.random.default_rng((seed, split, j))``: a split's images do not depend on another split's count.
    ``bar``: a progress bar to advance by each chunk."""
    check_int(count, "pathfinder count", minimum=0)
    generator = PathfinderGenerator(settings)
    samples = []
    for chunk, start in enumerate(range(0, count, CHUNK)):
        drawn = generator.draw(min(CHUNK, count - start), np.random.default_rng((seed, split, chunk)))
        samples.extend(drawn)
        if bar is not None:
            bar.update(len(drawn))
    return samples


def sample_arrays(settings: PathfinderSettings, samples: list[PathfinderSample]) -> tuple[np.ndarray, np.ndarray]:
    """The samples' images (count, W, W) uint8 and labels (count,) int64."""
    size = settings.resolution
    images = np.stack([sample.image for sample in samples]) if samples else np.zeros((0, size, size), np.uint8)
    return images, np.array([sample.label for sample in samples], np.int64)


def pathfinder_images(settings: PathfinderSettings, count: int, seed: int = 0, split: int = 0, bar=None) -> tuple[np.ndarray, np.ndarray]:
    """The images and labels of ``pathfinder_samples(settings, count, seed, split, bar)``."""
    return sample_arrays(settings, pathfinder_samples(settings, count, seed, split, bar))


def load_pathfinder_gen(
    directory: str | None = None,
    *,
    resolution: int = 32,
    difficulty: str = "hard",
    train: int = 20_000,
    val: int = 2_000,
    test: int = 2_000,
    seed: int = 0,
) -> ClassificationData:
    """The generated task: ``train`` / ``val`` / ``test`` images at ``resolution`` and ``difficulty`` (LRA's
    settings, ``pathfinder_settings``), drawn by ``seed``; pixels as tokens 0-255 row by row, grid (res, res),
    2 classes. Cached on disk by the options, the seed and ``GENERATOR_VERSION``."""
    if directory is not None:
        raise ValueError(f"data {NAME!r} is generated and reads no directory, got {directory!r}; options: {', '.join(OPTIONS)}")
    settings = pathfinder_settings(resolution, difficulty)
    counts = {"train": train, "val": val, "test": test}
    for name, count in counts.items():
        check_int(count, f"{NAME} {name}")
    described = {"resolution": resolution, "difficulty": difficulty, **counts}
    key = cache_key(GENERATOR_VERSION, json.dumps({"seed": seed, **described, **asdict(settings)}, sort_keys=True))
    path = cache_directory() / NAME / f"{key}.npz"
    splits = load_examples(path, SPLITS)
    if splits is None:
        splits = {}
        with progress_bar(total=sum(counts.values()), desc=f"pathfinder{resolution} {difficulty}", unit="image") as bar:
            for number, name in enumerate(SPLITS):
                images, labels = pathfinder_images(settings, counts[name], seed, number, bar)
                splits[name] = Examples.from_array(images.reshape(len(images), -1), labels)
        store_examples(path, splits)
    source = f"{NAME}:" + ":".join(f"{key}={value}" for key, value in described.items())
    return ClassificationData(source, BYTE_VOCAB, 2, splits["train"], splits["val"], splits["test"], grid=(resolution, resolution))
