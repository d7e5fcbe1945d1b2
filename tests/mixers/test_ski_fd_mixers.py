"""SKI-TNO and FD-TNO mixers and the ski_tnn / fd_tnn models (Moreno et al. 2023)."""

import numpy
import pytest
import torch
from conftest import LENGTHS, assert_causal_gradient, relative_error

import tokenmix
from tokenmix.mixers.fd_tno import rfft_frequencies
from tokenmix.mixers.ski_tno import SkiTno, SkiTnoOptions
from tokenmix.ops import fast_fft_size, naive_toeplitz_matvec
from tokenmix.ops.ski import inverse_time_warp


def _check_against(fast, slow, inputs, tolerance):
    assert relative_error(fast, slow) < tolerance
    grad = torch.randn_like(fast)
    for a, b in zip(torch.autograd.grad(fast, inputs, grad), torch.autograd.grad(slow, inputs, grad), strict=True):
        assert relative_error(a, b) < tolerance


# A causal ski_tno applies its kernel at every lag by FFT: path and interpolation do not enter it.
SKI_VARIANTS = [(False, path, interpolation) for path in ("dense", "sparse") for interpolation in ("linear", "cubic")]
SKI_VARIANTS.append((True, "auto", "linear"))


@pytest.mark.parametrize(("causal", "path", "interpolation"), SKI_VARIANTS)
@pytest.mark.parametrize("n", LENGTHS)
def test_ski_tno_matches_its_explicit_matrix(n, causal, path, interpolation):
    options = {"rank": 16, "filter_size": 6, "knots": 8, "path": path, "interpolation": interpolation}
    mixer = tokenmix.build_mixer("ski_tno", 4, causal=causal, **options).double()
    x = torch.randn(2, n, 4, dtype=torch.float64, requires_grad=True)
    slow = torch.einsum("dij,bjd->bid", mixer.matrix(n), x)
    _check_against(mixer(x), slow, [x, *mixer.parameters()], 1e-10)


@pytest.mark.parametrize(("max_spacing", "count"), [(None, 6), (4, 14), (20, 6)])
def test_ski_low_rank_part_is_w_a_wt_built_from_scratch(max_spacing, count):
    """A_ij = RPE(sign(t) lambda^|t|), t = p_i - p_j, and W the hat weights, assembled independently.

    max_spacing = 4 at n = 50 asks for ceil(49 / 4) + 1 = 14 inducing points; 20 leaves the rank's 6.
    """
    n, decay = 50, 0.9
    mixer = SkiTno(3, options=SkiTnoOptions(rank=6, decay=decay, knots=4, max_spacing=max_spacing)).double()
    spacing = (n - 1) / (count - 1)
    points = torch.arange(count, dtype=torch.float64) * spacing
    lags = points[:, None] - points[None, :]
    warped = torch.sign(lags) * decay ** lags.abs()
    knots = torch.linspace(-1, 1, 9, dtype=torch.float64)
    values = mixer.rpe.values()
    values = values.detach().numpy()
    columns = [numpy.interp(warped.numpy(), knots.numpy(), values[:, c]) for c in range(3)]
    a = torch.from_numpy(numpy.stack(columns))
    w = (1 - (torch.arange(n, dtype=torch.float64)[:, None] / spacing - torch.arange(count)[None, :]).abs()).clamp_min(0)
    torch.testing.assert_close(mixer.low_rank_matrix(n), w @ a @ w.t())
    assert float(mixer.rpe(torch.zeros(1, dtype=torch.float64)).detach().abs().max()) == 0.0  # RPE(0) = 0


@pytest.mark.parametrize("path", ["dense", "sparse"])
def test_max_spacing_grows_the_grid_on_every_path(path):
    mixer = SkiTno(4, options=SkiTnoOptions(rank=8, knots=8, path=path, max_spacing=4)).double()
    x = torch.randn(2, 101, 4, dtype=torch.float64, requires_grad=True)
    assert mixer.inducing_count(101) == 26 and mixer.inducing_count(20) == 8
    slow = torch.einsum("dij,bjd->bid", mixer.matrix(101), x)
    _check_against(mixer(x), slow, [x, *mixer.parameters()], 1e-10)


def test_gain_scales_parameters_not_the_initial_operator():
    torch.manual_seed(0)
    plain = SkiTno(3, options=SkiTnoOptions(gain=1.0))
    torch.manual_seed(0)
    scaled = SkiTno(3, options=SkiTnoOptions(gain=8.0))
    torch.testing.assert_close(plain.matrix(20), scaled.matrix(20))
    assert float(scaled.band.detach().abs().max()) * 8 == pytest.approx(float(scaled.taps.detach().abs().max()))


def test_ski_band_is_centred_and_odd():
    mixer = SkiTno(2, options=SkiTnoOptions(filter_size=32))
    assert mixer.filter_size == 33 and mixer.min_lag == -16
    band = mixer.sparse_matrix(40)
    assert torch.all(band[:, 20, 4:37] != 0) and torch.all(band[:, 20, :4] == 0) and torch.all(band[:, 20, 37:] == 0)


def test_inverse_time_warp_maps_every_lag_into_the_unit_interval():
    lags = torch.tensor([-1e6, -3.0, 0.0, 1.0, 1e6], dtype=torch.float64)
    torch.testing.assert_close(inverse_time_warp(lags, 0.99), torch.tensor([-0.0, -(0.99**3), 0.0, 0.99, 0.0], dtype=torch.float64))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", LENGTHS)
def test_fd_tno_matches_dense_toeplitz_of_its_kernel(n, causal):
    mixer = tokenmix.build_mixer("fd_tno", 4, causal=causal, rpe_dim=8, rpe_layers=1).double()
    x = torch.randn(2, n, 4, dtype=torch.float64, requires_grad=True)
    slow = naive_toeplitz_matvec(x, mixer.kernel(n), causal)
    _check_against(mixer(x), slow, [x, *mixer.parameters()], 1e-10)
    fft_size = fast_fft_size(2 * n)
    assert relative_error(mixer.spectrum(fft_size), mixer.response(fft_size)) < 1e-12


def test_fd_causal_response_has_the_rpe_as_real_part():
    mixer = tokenmix.build_mixer("fd_tno", 3, causal=True).double()
    fft_size = 64
    response = mixer.rpe(rfft_frequencies(fft_size).double()).t()
    torch.testing.assert_close(mixer.spectrum(fft_size).real, response, rtol=0, atol=1e-12)


def test_fd_bidirectional_is_real_at_zero_and_nyquist():
    mixer = tokenmix.build_mixer("fd_tno", 3, causal=False)
    imaginary = mixer.spectrum(64).imag
    assert torch.all(imaginary[:, 0] == 0) and torch.all(imaginary[:, -1] == 0) and imaginary[:, 1:-1].abs().sum() > 0


@pytest.mark.parametrize("name", ["fd_tno", "ski_tno"])
def test_causal_float32_leakage_is_below_1e_6(name):
    mixer = tokenmix.build_mixer(name, 8, causal=True)
    x = torch.randn(2, 300, 8, requires_grad=True)
    (grad,) = torch.autograd.grad(mixer(x)[:, 150].sum(), x)
    assert_causal_gradient(grad, 150, tolerance=1e-6)


def test_auto_path_follows_the_measured_thresholds():
    from tokenmix.mixers.ski_tno import SPARSE_FROM_LENGTH

    for interpolation, threshold in SPARSE_FROM_LENGTH.items():
        mixer = SkiTno(2, options=SkiTnoOptions(interpolation=interpolation))
        if threshold is None:
            assert not mixer.uses_sparse_path(10**6)
        else:
            assert mixer.uses_sparse_path(threshold) and (threshold == 1 or not mixer.uses_sparse_path(threshold - 1))
    assert SkiTno(2, options=SkiTnoOptions(path="sparse")).uses_sparse_path(8)
    assert not SkiTno(2, options=SkiTnoOptions(path="dense")).uses_sparse_path(10**6)


@pytest.mark.parametrize(
    ("name", "options", "argument"),
    [
        ("ski_tno", {"filter_size": 0}, "filter_size"),
        ("ski_tno", {"rank": 1}, "rank"),
        ("ski_tno", {"decay": 1.0}, "decay"),
        ("ski_tno", {"interpolation": "quadratic"}, "interpolation"),
        ("ski_tno", {"path": "fast"}, "path"),
        ("ski_tno", {"knots": 0}, "knots"),
        ("ski_tno", {"gain": 0}, "gain"),
        ("ski_tno", {"max_spacing": 0.5}, "max_spacing"),
        ("fd_tno", {"activation": "tanh"}, "activation"),
        ("fd_tno", {"rpe_dim": 0}, "rpe_dim"),
        ("fd_tno", {"decay": 0.9}, "decay"),
    ],
)
def test_bad_options_raise_value_error(name, options, argument):
    with pytest.raises(ValueError, match=argument):
        tokenmix.build_mixer(name, 4, **options)


def _tail_energy(activation: str, seeds: int = 8) -> float:
    """Mean fraction of a random FD kernel's energy beyond lag 64 (n = 1024)."""
    fractions = []
    for seed in range(seeds):
        torch.manual_seed(seed)
        taps = tokenmix.build_mixer("fd_tno", 16, causal=True, activation=activation).kernel(1024).detach()
        energy = taps.pow(2)
        fractions.append(float(energy[64:].sum() / energy.sum()))
    return sum(fractions) / len(fractions)


def test_gelu_responses_decay_faster_than_relu_ones():
    """Paper 000, §4.2 (Theorems 2-4, Figs 4-6): smoother frequency responses, faster time decay."""
    assert _tail_energy("gelu") < _tail_energy("relu")


def test_retaining_freed_memory_can_be_turned_off(monkeypatch):
    from tokenmix.runtime import ENVIRONMENT_VARIABLE, retain_freed_memory

    monkeypatch.setenv(ENVIRONMENT_VARIABLE, "0")
    assert retain_freed_memory() is False
