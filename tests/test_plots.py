import pytest
import torch

import tokenmix
from tokenmix.plots import operator_panels, plot_fd_responses, plot_operators


def test_fd_response_figure_is_written(tmp_path):
    path = plot_fd_responses(tmp_path / "sub" / "fd.png", n=64)
    assert path.exists() and path.stat().st_size > 1000


@pytest.mark.parametrize("name", ["tnn", "ski_tnn", "fd_tnn"])
def test_operator_figures_for_every_toeplitz_layer(tmp_path, name):
    model = tokenmix.build_model(name, task="mlm", vocab_size=10, dim=8, depth=2)
    files = plot_operators(model, tmp_path, n=32)
    assert len(files) == (4 if name == "fd_tnn" else 2) and all(f.exists() for f in files)


def test_ski_panels_add_up_to_the_operator():
    mixer = tokenmix.build_mixer("ski_tno", 3, rank=8)
    panels = operator_panels(mixer, 40, channel=1)
    torch.testing.assert_close(panels["sum"], mixer.matrix(40)[1])


def test_models_without_toeplitz_mixers_are_refused(tmp_path):
    model = tokenmix.build_model("transformer_xl", vocab_size=10, dim=8, depth=1)
    with pytest.raises(ValueError, match="Toeplitz"):
        plot_operators(model, tmp_path)
