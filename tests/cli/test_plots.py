import pytest
import torch

import tokenmix
from tokenmix.cli.plots import plot_fd_responses, plot_operators
from tokenmix.ops.ema import naive_ema


def test_fd_response_figure_is_written(tmp_path):
    path = plot_fd_responses(tmp_path / "sub" / "fd.png", n=64)
    assert path.exists() and path.stat().st_size > 1000


@pytest.mark.parametrize("name", ["tnn", "ski_tnn", "fd_tnn", "mega"])
def test_operator_figures_for_every_toeplitz_layer(tmp_path, name):
    model = tokenmix.build_model(name, task="mlm", vocab_size=10, dim=8, depth=2)
    files = plot_operators(model, tmp_path, n=32)
    assert len(files) == (4 if name == "fd_tnn" else 2) and all(f.exists() for f in files)


@pytest.mark.parametrize("name", ["tno", "fd_tno", "ski_tno", "ema"])
@pytest.mark.parametrize("causal", [False, True])
def test_a_channel_slice_of_the_operator_is_that_slice_of_the_whole(name, causal):
    mixer = tokenmix.build_mixer(name, 5, causal)
    whole = mixer.operator_matrices(30)
    part = mixer.operator_matrices(30, slice(2, 4))
    assert part.keys() == whole.keys()
    for title in whole:
        torch.testing.assert_close(part[title], whole[title][2:4])


def test_operator_pictures_build_only_the_pictured_channel(tmp_path, monkeypatch):
    """A (dim, n, n) stack for every channel would need dim times the memory (34 GB at dim 128, n = 8192)."""
    import tokenmix.mixers.base as base

    built = []
    original = base.naive_toeplitz_matrix

    def recording(kernel, n, causal):
        built.append(kernel.shape[1])
        return original(kernel, n, causal)

    monkeypatch.setattr(base, "naive_toeplitz_matrix", recording)
    plot_operators(tokenmix.build_model("tnn", task="lm", vocab_size=10, dim=8, depth=1), tmp_path, n=16, channel=3)
    assert built == [1]


def test_ski_panels_add_up_to_the_operator():
    mixer = tokenmix.build_mixer("ski_tno", 3, rank=8)
    panels = mixer.operator_matrices(40)
    torch.testing.assert_close(panels["sum"], mixer.matrix(40))
    torch.testing.assert_close(panels["band (sparse)"] + panels["W A W^T (low rank)"], panels["sum"])


def test_models_without_toeplitz_mixers_are_refused(tmp_path):
    model = tokenmix.build_model("transformer_xl", vocab_size=10, dim=8, depth=1)
    with pytest.raises(ValueError, match="Toeplitz"):
        plot_operators(model, tmp_path)


@pytest.mark.parametrize("causal", [False, True])
def test_ema_panel_is_the_operator_of_its_recurrence(causal):
    """Column j of the pictured T is the linear EMA's response to a unit impulse at j."""
    mixer = tokenmix.build_mixer("ema", 2, causal, ndim=3).double()
    matrix = mixer.operator_matrices(12)["T"][1]
    input_weight, decay, readout = mixer.coefficients()
    impulses = torch.eye(12, dtype=torch.float64)[:, :, None].expand(12, 12, 2)  # row j: impulse at j
    response = naive_ema(impulses, input_weight[0], decay[0], readout[0])
    if not causal:
        response = response + naive_ema(impulses.flip(1), input_weight[1], decay[1], readout[1]).flip(1)
    torch.testing.assert_close(matrix, response[:, :, 1].t())


def test_log_axes_are_labelled_at_the_lengths_and_at_round_values():
    """Fails if a log axis keeps matplotlib's decade-only labels (one label, 1000, over 512..8192) or labels every minor tick."""
    import matplotlib.pyplot as plt

    from tokenmix.bench.report import _against_length, log_ticks

    figure, axis = plt.subplots()
    axis.plot([512, 2048, 8192], [61.0, 120.0, 390.0], label="tno")
    _against_length(axis, "ms", "time")
    figure.canvas.draw()
    assert list(axis.get_xticks()) == [512, 2048, 8192]
    labels = [label.get_text() for label in axis.get_yticklabels() if label.get_text()]
    assert 3 <= len(labels) <= 8 and labels == sorted(labels, key=float)
    assert all(not label.get_text() for label in axis.yaxis.get_minorticklabels())
    plt.close(figure)
    for low, high in ((60, 400), (1100, 2800), (0.5, 5000), (700, 1500)):
        ticks = log_ticks(low, high)
        assert 3 <= len(ticks) <= 8 and all(low <= tick <= high for tick in ticks), (low, high, ticks)


def test_the_heatmap_colourbar_labels_stay_apart(tmp_path):
    """The bar is labelled at each decade down to ten times the linear range and at 0, never at the linear
    range's edges, whose labels sat on the 0."""
    import matplotlib.pyplot as plt

    from tokenmix.cli.plots import DYNAMIC_RANGE, _heatmap

    figure, axis = plt.subplots()
    matrix = torch.linspace(-3.0, 2.0, 64).reshape(8, 8)
    _heatmap(figure, axis, matrix, "T")
    bar = figure.axes[-1]
    ticks = [tick for tick in bar.get_yticks() if tick]
    assert min(abs(tick) for tick in ticks) >= 10 * 3.0 * DYNAMIC_RANGE * 0.999 and max(ticks) == 3.0
    assert 0.0 in bar.get_yticks() and len(set(label.get_text() for label in bar.get_yticklabels())) == len(bar.get_yticks())
    plt.close(figure)
