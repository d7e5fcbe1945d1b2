"""The diagonal state-space mixer (``ssm``), its modal ops and the balanced-truncation fit (``ops/balanced.py``)."""

import pytest
import torch
from conftest import LENGTHS, random_chunks, relative_error, usage_error

import tokenmix
from tokenmix.ops.balanced import balanced_modes, hankel_singular_values
from tokenmix.ops.modal import modal_chunk, modal_kernel, naive_modal
from tokenmix.ops.toeplitz import toeplitz_matvec


def random_modes(channels: int, pairs: int, seed: int = 0, largest: float = 0.97) -> tuple[torch.Tensor, torch.Tensor]:
    """A real kernel's modes: ``pairs`` complex-conjugate pairs per channel (order 2 * pairs), magnitudes in (0.6, largest)."""
    generator = torch.Generator().manual_seed(seed)
    magnitude = torch.rand(channels, pairs, generator=generator, dtype=torch.float64) * (largest - 0.6) + 0.6
    angle = torch.rand(channels, pairs, generator=generator, dtype=torch.float64) * 3.0
    poles = torch.polar(magnitude, angle)
    residues = torch.complex(*torch.randn(2, channels, pairs, generator=generator, dtype=torch.float64))
    return torch.cat([poles, poles.conj()], dim=1), torch.cat([residues, residues.conj()], dim=1)


@pytest.mark.parametrize("n", LENGTHS)
def test_the_modal_recurrence_in_chunks_is_the_convolution_with_its_kernel(n):
    """``modal_chunk`` from a carried state over random chunks = the kernel's convolution = the loop."""
    poles, residues = random_modes(3, 2)
    u = torch.randn(2, n, 3, dtype=torch.float64)
    whole = toeplitz_matvec(u, modal_kernel(poles, residues, n), causal=True)
    state, outputs = torch.zeros(2, 3, 4, dtype=torch.complex128), []
    for chunk in random_chunks(n):
        y, state = modal_chunk(u[:, chunk], state, poles, residues)
        outputs.append(y)
    looped, final = naive_modal(u, poles, residues, output_final_state=True)
    assert relative_error(torch.cat(outputs, dim=1), whole) < 1e-10
    assert relative_error(looped, whole) < 1e-10
    assert relative_error(torch.view_as_real(state), torch.view_as_real(final)) < 1e-10


def test_a_long_prompt_in_one_chunk_is_the_loop():
    """A chunk past ``GROUP_ROWS`` / batch tokens and not a whole number of blocks (groups of blocks, then a tail)
    from a non-zero state gives the loop's outputs and final state."""
    from tokenmix.ops.modal import BLOCK, GROUP_ROWS

    poles, residues = random_modes(3, 2, seed=7)
    n = GROUP_ROWS + 3 * BLOCK + 17  # at batch 2: two groups of GROUP_ROWS / 2 tokens, then a tail
    u = torch.randn(2, n, 3, dtype=torch.float64)
    start = torch.randn(2, 3, 4, dtype=torch.complex128)
    y, state = modal_chunk(u, start, poles, residues)
    looped, final = naive_modal(u, poles, residues, initial_state=start, output_final_state=True)
    assert relative_error(y, looped) < 1e-10
    assert relative_error(torch.view_as_real(state), torch.view_as_real(final)) < 1e-10


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("window", [0, 3])
def test_the_ssm_forward_equals_its_loops_forward_and_gradients(n, window):
    mixer = tokenmix.build_mixer("ssm", 4, causal=True, order=5, window=window).double()
    x = torch.randn(2, n, 4, dtype=torch.float64, requires_grad=True)
    fast, slow = mixer(x), mixer.naive_forward(x)
    assert relative_error(fast, slow) < 1e-10
    grad = torch.randn_like(fast)
    parameters = [x, *mixer.parameters()]  # unused ones (the taps without a window, the modes within it) get None or zeros

    def gradients(y):
        return [
            torch.zeros_like(p) if g is None else g
            for p, g in zip(parameters, torch.autograd.grad(y, parameters, grad, allow_unused=True), strict=True)
        ]

    for a, b in zip(gradients(fast), gradients(slow), strict=True):
        assert relative_error(a, b) < 1e-9 or float(b.abs().max()) == float(a.abs().max()) == 0.0


@pytest.mark.parametrize("window", [0, 4])
def test_ssm_streams_in_any_chunks_with_a_state_that_does_not_grow(window):
    mixer = tokenmix.build_mixer("ssm", 3, causal=True, order=6, window=window).double()
    x = torch.randn(2, 300, 3, dtype=torch.float64)
    state = mixer.init_state(2)
    outputs, sizes = [], set()
    for chunk in random_chunks(300, seed=3):
        y, state = mixer.step(x[:, chunk], state)
        outputs.append(y)
        sizes.add(state.nbytes())
    assert relative_error(torch.cat(outputs, dim=1), mixer(x)) < 1e-10
    assert sizes == {2 * 3 * (window + 6 * 2) * 8}


def test_decoding_without_autograd_follows_every_change_of_the_modes():
    """Outside autograd the step keeps the poles' polar form between calls; changed modes (``set_modes``, a loaded
    state dict, an optimiser's step, replaced data) are used from the next step on."""
    mixer = tokenmix.build_mixer("ssm", 3, causal=True, order=4).double()
    x = torch.randn(1, 20, 3, dtype=torch.float64)

    def decoded() -> torch.Tensor:
        state, outputs = mixer.init_state(1, dtype=x.dtype), []
        with torch.no_grad():
            for t in range(x.shape[1]):
                y, state = mixer.step(x[:, t : t + 1], state)
                outputs.append(y)
        return torch.cat(outputs, dim=1)

    assert relative_error(decoded(), mixer(x)) < 1e-10
    poles, residues = random_modes(3, 2, seed=5)
    mixer.set_modes(poles, residues)
    assert relative_error(decoded(), mixer(x)) < 1e-10
    mixer.load_state_dict({**mixer.state_dict(), "residue": torch.randn(3, 4, 2, dtype=torch.float64)})
    assert relative_error(decoded(), mixer(x)) < 1e-10
    mixer.pole_angle.grad = torch.ones_like(mixer.pole_angle)
    torch.optim.SGD(mixer.parameters(), lr=0.1).step()
    assert relative_error(decoded(), mixer(x)) < 1e-10
    mixer.pole_logit.data = mixer.pole_logit.data - 0.5  # replaced, not changed in place
    assert relative_error(decoded(), mixer(x)) < 1e-10


@pytest.mark.parametrize("pairs", [1, 4, 8])
def test_a_sum_of_damped_exponentials_is_recovered_at_its_order(pairs):
    """A kernel that is exactly N = 2 * pairs modes (a real kernel: conjugate pairs) is fitted at order N
    to 1e-8, over its horizon and past it (modes that have decayed below 1e-18 by the horizon's end)."""
    poles, residues = random_modes(6, pairs, seed=pairs, largest=0.9)
    kernel = modal_kernel(poles, residues, 400)
    fit = balanced_modes(kernel, 2 * pairs)
    assert relative_error(fit.kernel(400), kernel) < 1e-8
    assert relative_error(fit.kernel(800), modal_kernel(poles, residues, 800)) < 1e-8
    assert bool((fit.poles.abs() < 1).all())
    assert float(fit.bound.max()) < 1e-8 * float(kernel.abs().sum(dim=0).max())


@pytest.mark.parametrize("order", [1, 2, 5, 12])
def test_the_hankel_bound_holds_for_every_fit(order):
    """||k - k_N||_2 <= 2 sum_{i > N} sigma_i, for modal kernels fitted below their order and for a TNO's
    kernels (decaying, and without decay); every pole inside the unit circle."""
    poles, residues = random_modes(4, 8, seed=order)
    tno = tokenmix.build_mixer("tno", 4, causal=True, rpe_dim=8).double()
    flat = tokenmix.build_mixer("tno", 4, causal=True, rpe_dim=8, decay=1.0).double()
    with torch.no_grad():
        kernels = [modal_kernel(poles, residues, 200), tno.kernel(200), flat.kernel(200)]
    for kernel in kernels:
        fit = balanced_modes(kernel, order)
        error = (fit.kernel(200) - kernel).norm(dim=0)
        assert bool((error <= fit.bound * (1 + 1e-9) + 1e-12).all()), (error, fit.bound)
        assert bool((fit.poles.abs() < 1).all())
        singular = hankel_singular_values(kernel)
        assert torch.allclose(fit.singular_values, singular) and bool((singular[:, :-1] >= singular[:, 1:]).all())


def test_one_decomposition_truncated_at_each_order_is_each_order_fitted_alone():
    """``fit_kernel`` decomposes each block of channels once for every order; each order's fit is the one
    ``balanced_modes`` makes alone (channels past one block included)."""
    from tokenmix.models.distil import CHANNEL_BLOCK, fit_kernel

    poles, residues = random_modes(CHANNEL_BLOCK + 3, 4, seed=3)
    kernel = modal_kernel(poles, residues, 60)
    for order, (modes, errors) in zip([2, 5], fit_kernel(kernel, [2, 5], window=3), strict=True):
        alone = balanced_modes(kernel[3:], order)
        assert torch.equal(modes["poles"], alone.poles) and torch.equal(modes["residues"], alone.residues)
        assert torch.equal(modes["taps"], kernel[:3].t())
        assert torch.allclose(errors["relative_l2"], (alone.kernel(57) - kernel[3:]).norm(dim=0) / kernel.norm(dim=0))


def test_the_recommended_order_is_the_smallest_within_the_budget():
    from tokenmix.models.distil import recommended_order

    rows = [{"order": order, "loss_increase": increase} for order, increase in ((4, 0.02), (8, 0.004), (16, -0.001), (32, 0.0001))]
    assert recommended_order(rows, 0.005) == 8
    assert recommended_order(rows, 0.0) == 16
    with pytest.raises(ValueError, match=r"no order of \[4, 8, 32\] keeps the loss within it; the closest, order 32, adds 0.0100%"):
        recommended_order([row for row in rows if row["order"] != 16], 0.0)


def test_fitted_modes_load_into_the_mixer():
    """``Ssm.set_modes`` with a fit and the kernel's first lags as taps gives the kernel back."""
    poles, residues = random_modes(3, 3, largest=0.75)
    window = 2
    kernel = torch.cat([torch.randn(window, 3, dtype=torch.float64), modal_kernel(poles, residues, 98)])
    fit = balanced_modes(kernel[window:], 6)
    mixer = tokenmix.build_mixer("ssm", 3, causal=True, order=6, window=window).double()
    mixer.set_modes(fit.poles, fit.residues, kernel[:window].t())
    with torch.no_grad():
        assert relative_error(mixer.kernel(100), kernel) < 1e-8


def test_bad_orders_and_modes_are_refused():
    kernel = torch.randn(10, 2, dtype=torch.float64)
    for order in (0, 11):
        with pytest.raises(ValueError, match=f"order must be between 1 and the kernel's 10 lags, got {order}"):
            balanced_modes(kernel, order)
    with pytest.raises(ValueError, match="ssm is causal"):
        tokenmix.build_mixer("ssm", 4, causal=False)
    mixer = tokenmix.build_mixer("ssm", 2, causal=True, order=1)
    with pytest.raises(ValueError, match="poles must lie strictly inside the unit circle"):
        mixer.set_modes(torch.ones(2, 1, dtype=torch.complex128), torch.ones(2, 1, dtype=torch.complex128))


def test_distilled_model_keeps_every_other_weight_and_a_bounded_state():
    """``distil`` swaps each causal Toeplitz mixer (tno, fd_tno, ski_tno) for an ``ssm`` and keeps the rest;
    the distilled model streams with a state that does not grow, and equals itself streamed."""
    from tokenmix.models.distil import distil

    for name in ("tnn", "fd_tnn", "ski_tnn"):
        model = tokenmix.build_model(name, vocab_size=20, dim=8, depth=2).double().eval()
        distilled, reports = distil(model, 8, window=2, horizon=64)
        assert [report["mixer"] for report in reports] == ["blocks.0.token_mixing.mixer", "blocks.1.token_mixing.mixer"]
        assert distilled.config.options["mixer"].as_dict() == {"name": "ssm", "order": 8, "window": 2}
        kept = {key: value for key, value in model.state_dict().items() if ".mixer." not in key}
        assert all(torch.equal(distilled.state_dict()[key], value) for key, value in kept.items())
        tokens = torch.randint(0, 20, (2, 50))
        state, sizes, outputs = distilled.init_state(2), set(), []
        with torch.no_grad():
            for chunk in random_chunks(50, seed=1):
                logits, state = distilled(tokens[:, chunk], state=state, return_state=True)
                outputs.append(logits)
                sizes.add(state.nbytes())
            assert relative_error(torch.cat(outputs, dim=1), distilled(tokens)) < 1e-10
        assert len(sizes) == 1


def test_distil_refuses_what_it_cannot_do():
    from tokenmix.models.distil import distil

    causal = tokenmix.build_model("tnn", vocab_size=20, dim=8, depth=1)
    with pytest.raises(ValueError, match="order must be an integer >= 1, got 0"):
        distil(causal, 0)
    with pytest.raises(ValueError, match=r"order=70 must be at most the horizon's 62 lags past the window \(horizon=64, window=2\)"):
        distil(causal, 70, window=2, horizon=64)
    with pytest.raises(ValueError, match="distil needs a causal language model"):
        distil(tokenmix.build_model("tnn", task="mlm", vocab_size=20, dim=8, depth=1), 4)
    with pytest.raises(ValueError, match="model 'transformer' has no causal Toeplitz mixer"):
        distil(tokenmix.build_model("transformer", vocab_size=20, dim=8, depth=1), 4)


def test_a_distilled_run_is_a_run_every_command_reads(tiny_runs, tmp_path, capsys):
    """``tokenmix distil RUN --order N --out OUT`` writes a run directory: eval, generate, export-hf and
    open_run read it, its report has a row per mixer, and an existing run is not overwritten."""
    import json

    from tokenmix.cli import main

    out = tmp_path / "distilled"
    assert main(["distil", str(tiny_runs["lm"]), "--order", "4", "--window", "2", "--horizon", "64", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads((out / "distil.json").read_text())
    assert report["order"] == 4 and len(report["layers"]) == 1 and "blocks.0.token_mixing.mixer" in printed
    assert main(["eval", str(tiny_runs["lm"]), str(out), "--split", "val", "--max-tokens", "64"]) == 0
    assert main(["generate", str(out), "--max-new-tokens", "5", "--prompt", "To be"]) == 0
    assert tokenmix.open_run(out / "model").model.config.options["mixer"]["name"] == "ssm"
    assert "already holds a run" in usage_error(["distil", str(tiny_runs["lm"]), "--order", "4", "--out", str(out)], capsys)


def test_distil_sweeps_orders_within_a_loss_budget(tiny_runs, tmp_path, capsys):
    """``--max-loss-increase`` fits every order once, evaluates each distilled model, writes the smallest order within
    the budget with the sweep in its report and a plot; without a budget it takes one order only."""
    import json

    from tokenmix.cli import main
    from tokenmix.models.distil import recommended_order

    out, budget = tmp_path / "swept", 0.5
    flags = ["--order", "6,2,4", "--horizon", "64", "--eval-tokens", "128", "--out", str(out), "--json", str(tmp_path / "report.json")]
    assert main(["distil", str(tiny_runs["lm"]), "--max-loss-increase", f"{100 * budget}%", *flags]) == 0
    report = json.loads((out / "distil.json").read_text())
    assert json.loads((tmp_path / "report.json").read_text()) == report
    sweep = report["sweep"]
    assert [row["order"] for row in sweep] == [2, 4, 6] and report["max_loss_increase"] == budget
    assert all(row["loss_increase"] == pytest.approx(row["loss"] / row["exact_loss"] - 1) for row in sweep)
    assert report["order"] == recommended_order(sweep, budget)
    assert tokenmix.open_run(out / "model").model.config.options["mixer"]["order"] == report["order"]
    assert [row["state_bytes"] for row in sweep] == sorted({row["state_bytes"] for row in sweep})  # grows with the order
    assert (out / "distil_sweep.png").stat().st_size > 0
    distil = ["distil", str(tiny_runs["lm"]), "--out", str(tmp_path / "x")]
    assert "--order: give one order" in usage_error([*distil, "--order", "2,4"], capsys)
    assert "--eval-tokens belongs to a sweep" in usage_error([*distil, "--order", "2", "--eval-tokens", "64"], capsys)
    too_wide = [*distil, "--max-loss-increase", "1", "--window", "64", "--horizon", "64"]
    assert "--window 64 must be below --horizon 64" in usage_error(too_wide, capsys)


def test_a_distilled_language_model_is_fine_tuned_on_its_own_text(tiny_runs, tmp_path):
    """``tokenmix finetune`` trains a distilled causal LM on from its weights, on the data its run was trained on:
    the state space's poles and residues move, the model stays a state space, other weights start where they were."""
    from tokenmix.cli import main
    from tokenmix.runs.checkpoint import load_checkpoint

    distilled, tuned = tmp_path / "distilled", tmp_path / "tuned"
    assert main(["distil", str(tiny_runs["lm"]), "--order", "3", "--horizon", "64", "--out", str(distilled)]) == 0
    assert main(["finetune", str(distilled), "--steps", "2", "--batch-size", "2", "--eval-tokens", "64", "--out", str(tuned)]) == 0
    before, after = load_checkpoint(distilled), load_checkpoint(tuned)
    assert after["train_config"]["task"] == "lm" and after["train_config"]["data"] == before["train_config"]["data"]
    assert after["model_config"]["options"]["mixer"] == before["model_config"]["options"]["mixer"]
    mixer = "blocks.0.token_mixing.mixer."
    assert all(not torch.equal(after["model"][mixer + name], before["model"][mixer + name]) for name in ("pole_logit", "residue"))
