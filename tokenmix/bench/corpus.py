"""Generated text for ``tokenmix bench --kinds data``: word-like documents from a seeded generator, in files.

Words are 1-14 letters drawn with English letter frequencies (lengths Poisson(4)); ``LINES`` lines of 8-20
words each are drawn once per seed, the words by Zipf's law (weight 1 / (rank + 2.7) over ``WORDS`` words).
A text is lines drawn uniformly from those, each closing its document (a blank line after it) with
probability ``1 / DOCUMENT_LINES``: documents of 24 lines (about 1.6 kB) on average, one per paragraph for
``tokenmix prepare --text-unit paragraph``. Lines are joined whole, so text comes at ~100 MB/s; what a
tokenizer sees is words, which recur as in natural text, in lines that recur every ~10 MB. The same seed and
size give the same bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..io.files import write_bytes_atomic, write_json_atomic
from ..io.progress import progress_bar

VERSION = 1  # of the generator: a corpus written by another is written again
LETTERS = "etaoinshrdlcumwfgypbvkjxqz"
LETTER_PERCENT = (12.7, 9.1, 8.2, 7.5, 7.0, 6.7, 6.3, 6.1, 6.0, 4.3, 4.0, 2.8, 2.8, 2.4, 2.4, 2.2, 2.0, 2.0, 1.9, 1.5, 1.0, 0.8,
                  0.15, 0.15, 0.1, 0.07)  # fmt: skip
WORDS, LINES = 1 << 15, 1 << 17
LINE_WORDS = (8, 20)
DOCUMENT_LINES = 24
FILE_BYTES = 64 << 20  # text per file of a written corpus
MARKER = "corpus.json"  # written last: the corpus in the folder is whole


class WordText:
    """The generator of one ``seed``: ``text(size, part)`` is the part's text."""

    def __init__(self, seed: int):
        self.seed = seed
        rng = np.random.default_rng([seed, VERSION])
        lengths = np.clip(rng.poisson(4.0, WORDS), 1, 14)
        frequencies = np.array(LETTER_PERCENT) / sum(LETTER_PERCENT)
        letters = "".join(rng.choice(list(LETTERS), size=int(lengths.sum()), p=frequencies).tolist())
        ends = np.cumsum(lengths).tolist()
        words = [letters[end - length : end] for end, length in zip(ends, lengths.tolist(), strict=True)]
        zipf = 1 / (np.arange(1, WORDS + 1) + 2.7)
        counts = rng.integers(LINE_WORDS[0], LINE_WORDS[1] + 1, LINES)
        drawn = rng.choice(WORDS, size=int(counts.sum()), p=zipf / zipf.sum()).tolist()
        bounds = [0, *np.cumsum(counts).tolist()]
        lines = [" ".join(map(words.__getitem__, drawn[start:stop])) + "\n" for start, stop in zip(bounds[:-1], bounds[1:], strict=True)]
        # piece 2i: line i; 2i + 1: line i ending a document
        self.pieces = [piece for line in lines for piece in (line.encode(), (line + "\n").encode())]
        self.mean = sum(map(len, self.pieces)) / len(self.pieces)

    def text(self, size: int, part: int = 0) -> bytes:
        """At most ``size`` bytes ending at the end of a document (of a line when ``size`` is shorter than its first)."""
        rng = np.random.default_rng([self.seed, VERSION, part])
        blocks, total = [], 0
        while total <= size:
            count = int((size - total) / self.mean * 1.02) + 64
            chosen = rng.integers(0, LINES, count) * 2 + (rng.random(count) < 1 / DOCUMENT_LINES)
            blocks.append(b"".join(map(self.pieces.__getitem__, chosen.tolist())))
            total += len(blocks[-1])
        data = b"".join(blocks)
        end = data.rfind(b"\n\n", 0, size)
        return data[: end + 2] if end >= 0 else data[: data.rfind(b"\n", 0, size) + 1]


def corpus_files(folder, size: int, seed: int = 0) -> list[Path] | None:
    """The files of the corpus of ``size`` bytes and ``seed`` written in ``folder``, None unless it is whole there."""
    marker = Path(folder) / MARKER
    try:
        written = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    if written.get("version") != VERSION or written.get("size") != size or written.get("seed") != seed:
        return None
    files = [Path(folder) / entry["name"] for entry in written["files"]]
    if any(not path.is_file() or path.stat().st_size != entry["bytes"] for path, entry in zip(files, written["files"], strict=True)):
        return None
    return files


def write_corpus(folder, size: int, seed: int = 0, file_bytes: int = FILE_BYTES, progress: bool = False) -> list[Path]:
    """``size`` bytes of text (a document short at most) in files of about ``file_bytes`` in ``folder``
    (each written atomically, ``MARKER`` last); a whole corpus of the same size and seed already there is kept."""
    files = corpus_files(folder, size, seed)
    if files is not None:
        return files
    folder = Path(folder)
    (folder / MARKER).unlink(missing_ok=True)
    generator, files, written = WordText(seed), [], 0
    count = max(1, -(-size // file_bytes))
    with progress_bar(total=size, unit="B", unit_scale=True, desc="generating text", disable=not progress) as bar:
        for part in range(count):  # each file up to its share's end: what a file falls short by, the next one takes
            data = generator.text((part + 1) * size // count - written, part)
            files.append(write_bytes_atomic(folder / f"text-{part:05d}.txt", data))
            written += len(data)
            bar.update(len(data))
    entries = [{"name": path.name, "bytes": path.stat().st_size} for path in files]
    write_json_atomic(folder / MARKER, {"version": VERSION, "seed": seed, "size": size, "files": entries})
    return files
