"""A GLUE-format fixture: SST-2 and STS-B in the release layout, where one sentiment word decides
the label (SST-2) or the score (STS-B). The tests use it; `python tests/glue_fixture.py DIR` writes
it for a demonstration run (docs/language.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

GOOD, BAD = "good great fine lovely superb".split(), "bad awful poor dull boring".split()
STSB_HEADER = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"


def write_glue(root, train: int = 400, dev: int = 80, seed: int = 0) -> Path:
    """``root/SST-2/{train,dev}.tsv`` and ``root/STS-B/{train,dev}.tsv``; returns ``root``."""
    generator = torch.Generator().manual_seed(seed)
    root = Path(root)
    for task in ("SST-2", "STS-B"):
        (root / task).mkdir(parents=True, exist_ok=True)
    for split, count in (("train", train), ("dev", dev)):
        labels = torch.randint(0, 2, (count,), generator=generator).tolist()
        words = torch.randint(0, 5, (count,), generator=generator).tolist()
        pairs = list(zip(labels, words, strict=True))
        rows = [f"the play was {(GOOD if y else BAD)[w]} .\t{y}" for y, w in pairs]
        (root / "SST-2" / f"{split}.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
        rows = [
            f"{i}\tg\tf\t2012\t{i}\tn\tn\tthe play .\tit was {(GOOD if y else BAD)[w]} .\t{4.0 * y + 0.1 * w:.1f}"
            for i, (y, w) in enumerate(pairs)
        ]
        (root / "STS-B" / f"{split}.tsv").write_text(STSB_HEADER + "\n" + "\n".join(rows) + "\n")
    return root


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/glue_fixture.py DIR")
    print(write_glue(sys.argv[1]))
