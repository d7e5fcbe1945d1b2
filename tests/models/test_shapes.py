import numpy as np
import pytest
import torch

from tokenmix.data import load_data
from tokenmix.data.shapes import SHAPES, _outline


def test_outlines_are_the_named_shapes():
    square, plus, cross, circle = (_outline(shape, 7) for shape in range(len(SHAPES)))
    assert square.sum() == 24 and not square[1:-1, 1:-1].any()
    assert plus.sum() == 13 and plus[3].all() and plus[:, 3].all()
    assert cross.sum() == 13 and np.diag(cross).all() and np.diag(cross[:, ::-1]).all()
    for shape in (square, plus, cross, circle):  # every shape is symmetric under the square's symmetries
        assert (shape == shape.T).all() and (shape == shape[::-1]).all() and (shape == shape[:, ::-1]).all()
    assert not circle[3, 3] and circle[0, 3] and not circle[0, 0]


def test_images_hold_one_bright_shape_on_a_dark_background():
    data = load_data("shapes:size=12:train=200:val=20:test=30", 0, seed=3)
    assert data.grid == (12, 12) and data.vocab_size == 256 and data.num_classes == 4
    assert [len(data.split(split)) for split in ("train", "val", "test")] == [200, 20, 30]
    pixels = data.train.tokens.view(200, 144).long()
    bright = pixels >= 128
    assert ((pixels < 64) | bright).all() and bright.any(dim=1).all()
    assert set(data.train.labels.tolist()) == {0, 1, 2, 3}
    for row in range(20):  # the bright pixels are the label's outline at some extent and place
        image = bright[row].view(12, 12).numpy()
        fits = [
            (_outline(int(data.train.labels[row]), size) == image[t : t + size, c : c + size]).all()
            for size in range(5, 13)
            for t in range(0, 13 - size)
            for c in range(0, 13 - size)
            if image[t : t + size, c : c + size].sum() == image.sum()
        ]
        assert any(fits), row


def test_the_seed_fixes_the_task_and_the_evaluation_sets_do_not_depend_on_the_train_count():
    a, b = load_data("shapes:train=100", 0, seed=1), load_data("shapes:train=300", 0, seed=1)
    assert torch.equal(a.test.tokens, b.test.tokens) and torch.equal(a.val.labels, b.val.labels)
    assert not torch.equal(a.test.tokens, load_data("shapes:train=100", 0, seed=2).test.tokens)


@pytest.mark.parametrize(
    ("source", "message"), [("shapes:/data", "reads no directory"), ("shapes:size=3", "size"), ("shapes:colour=1", "unknown options")]
)
def test_bad_shapes_sources_are_refused(source, message):
    with pytest.raises(ValueError, match=message):
        load_data(source, 0)
