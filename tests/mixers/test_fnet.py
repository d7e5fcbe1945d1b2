import math

import pytest
import torch
from conftest import relative_error

import tokenmix
from tokenmix.ops import fourier_ar_matrix, fourier_ar_mix, naive_fourier_ar_mix


@pytest.mark.parametrize("n", [1, 7, 100, 1000, 1024])
def test_fnet_is_the_real_part_of_the_2d_fft(n):
    x = torch.randn(2, n, 6, dtype=torch.float64)
    mixer = tokenmix.build_mixer("fnet", 6)
    torch.testing.assert_close(mixer(x), torch.fft.fftn(x, dim=(-2, -1)).real)
    sequence_only = tokenmix.build_mixer("fnet", 6, sequence_only=True)
    torch.testing.assert_close(sequence_only(x), torch.fft.fft(x, dim=1).real)


def test_fnet_padding_and_rejects_causal():
    mixer = tokenmix.build_mixer("fnet", 4)
    x, mask = torch.randn(2, 10, 4), torch.ones(2, 10, dtype=torch.bool)
    mask[0, 7:] = False
    noisy = x.clone()
    noisy[~mask] = 50.0
    torch.testing.assert_close(mixer(x, mask), mixer(noisy, mask))
    with pytest.raises(ValueError, match="cannot be causal"):
        tokenmix.build_mixer("fnet", 4, causal=True)


def test_rolled_fourier_matrix_rows():
    matrix = fourier_ar_matrix(4, torch.float64)
    assert matrix.shape == (4, 7)
    assert matrix[0].tolist() == [1, 1, 1, 1, 0, 0, 0]  # frequency 0: a plain sum of the window
    for i in range(4):
        for m in range(4):
            assert matrix[i, i + m] == pytest.approx(math.cos(2 * math.pi * i * m / 4))
        assert torch.all(matrix[i, :i] == 0) and torch.all(matrix[i, i + 4 :] == 0)


@pytest.mark.parametrize("n, window", [(1, 4), (7, 3), (100, 16), (1000, 8), (1024, 32)])
def test_fnet_ar_matches_the_defining_loop(n, window):
    mixer = tokenmix.build_mixer("fnet_ar", 3, causal=True, window=window)
    x = torch.randn(2, n, 3, dtype=torch.float64)
    assert relative_error(mixer(x), naive_fourier_ar_mix(x, window)) < 1e-12


@pytest.mark.parametrize("n", [7, 100, 128])
def test_fnet_ar_gradients_match_the_loop(n):
    x = torch.randn(1, n, 2, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(1, n, 2, dtype=torch.float64)
    (fast,) = torch.autograd.grad(fourier_ar_mix(x, 16), x, grad)
    (slow,) = torch.autograd.grad(naive_fourier_ar_mix(x, 16), x, grad)
    assert relative_error(fast, slow) < 1e-12


def test_fnet_ar_is_exactly_causal():
    mixer = tokenmix.build_mixer("fnet_ar", 4, causal=True, window=8)
    x = torch.randn(2, 50, 4, requires_grad=True)
    (grad,) = torch.autograd.grad(mixer(x)[:, 20].sum(), x)
    assert torch.all(grad[:, 21:] == 0)
    assert torch.all(grad[:, 13:21].abs().sum(-1) > 0)  # the window of 8 inputs ending at 20
    assert torch.all(grad[:, :13] == 0)


@pytest.mark.parametrize("chunks", [[5, 5, 5, 5, 5, 5, 5, 5], [1] * 40, [3, 17, 1, 9, 10], [40]])
def test_fnet_ar_stream_in_chunks_equals_the_whole_stream(chunks):
    window = 8
    x = torch.randn(2, sum(chunks), 3, dtype=torch.float64)
    mixer = tokenmix.build_mixer("fnet_ar", 3, causal=True, window=window)
    pieces, start, state = [], 0, mixer.init_state(2, dtype=torch.float64)
    for size in chunks:
        piece, state = mixer.step(x[:, start : start + size], state)
        pieces.append(piece)
        start += size
    assert relative_error(torch.cat(pieces, dim=1), naive_fourier_ar_mix(x, window)) < 1e-12


@pytest.mark.parametrize(
    "options, message",
    [({"window": 0}, "window"), ({"window": 2.5}, "window")],
)
def test_fnet_ar_bad_options(options, message):
    with pytest.raises(ValueError, match=message):
        tokenmix.build_mixer("fnet_ar", 4, causal=True, **options)
    with pytest.raises(ValueError, match="causal"):
        tokenmix.build_mixer("fnet_ar", 4, causal=False)
