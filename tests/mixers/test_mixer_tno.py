import importlib.metadata
import re

import pytest
import torch
from conftest import LENGTHS, NEEDS_TRITON, RUNS_TRITON, compiled_for_gpus, relative_error

import tokenmix
from tokenmix.mixers.tno import Tno, TnoOptions
from tokenmix.ops import fused_toeplitz, naive_toeplitz_matvec, toeplitz
from tokenmix.ops.fused_toeplitz import kernels


def dense_tno(mixer: Tno, x: torch.Tensor) -> torch.Tensor:
    """Reference: the explicit Toeplitz matrix of the mixer's kernel t_k = lambda^|k| RPE(k)."""
    return naive_toeplitz_matvec(x, mixer.kernel(x.shape[1]), mixer.causal)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", LENGTHS)
def test_tno_matches_dense_reference(n, causal):
    mixer = tokenmix.build_mixer("tno", 4, causal=causal, rpe_dim=8, rpe_layers=1).double()
    x = torch.randn(2, n, 4, dtype=torch.float64, requires_grad=True)
    fast, slow = mixer(x), dense_tno(mixer, x)
    assert relative_error(fast, slow) < 1e-10
    grad = torch.randn_like(fast)
    inputs = [x, *mixer.parameters()]
    for a, b in zip(torch.autograd.grad(fast, inputs, grad), torch.autograd.grad(slow, inputs, grad), strict=True):
        assert relative_error(a, b) < 1e-9


@pytest.mark.parametrize("causal", [False, True])
def test_unfactored_spectrum_is_the_same_operator(causal):
    factored = tokenmix.build_mixer("tno", 4, causal=causal, rpe_dim=8).double()
    plain = tokenmix.build_mixer("tno", 4, causal=causal, rpe_dim=8, factored=False).double()
    plain.load_state_dict(factored.state_dict())
    x = torch.randn(2, 100, 4, dtype=torch.float64)
    y, y_plain = factored(x), plain(x)
    assert relative_error(y, y_plain) < 1e-12
    grads = torch.autograd.grad(y.square().sum(), list(factored.parameters()))
    grads_plain = torch.autograd.grad(y_plain.square().sum(), list(plain.parameters()))
    assert all(relative_error(a, b) < 1e-10 for a, b in zip(grads, grads_plain, strict=True))


def test_kernel_is_decayed_rpe_and_decay_one_turns_it_off():
    mixer = Tno(3, False, TnoOptions(decay=0.9))
    plain = Tno(3, False, TnoOptions(decay=1.0))
    plain.load_state_dict(mixer.state_dict())
    n = 6
    lags = torch.arange(-(n - 1), n).float()
    torch.testing.assert_close(mixer.kernel(n), 0.9 ** lags.abs()[:, None] * plain.kernel(n))
    torch.testing.assert_close(plain.kernel(n), plain.rpe(lags))


def test_learnable_decay_gets_gradient_and_stays_in_range():
    mixer = Tno(3, True, TnoOptions(decay=0.9, learnable_decay=True))
    assert 0.9 < float(mixer.decay.rate().detach()) < 1.0
    mixer(torch.randn(1, 20, 3)).sum().backward()
    assert mixer.decay.logit.grad is not None and mixer.decay.logit.grad != 0


def test_eval_cache_is_reused_and_invalidated():
    mixer = Tno(4, causal=False).eval()
    x = torch.randn(1, 16, 4)
    with torch.no_grad():
        first = mixer(x)
        (cached,) = mixer._cache.entries.values()
        mixer(x)
        assert [value is cached for value in mixer._cache.entries.values()] == [True]  # same length, same weights: reused
        mixer(torch.randn(1, 17, 4))
        assert [value is cached for value in mixer._cache.entries.values()] == [False]  # new length: recomputed
        mixer.rpe.output.bias.add_(1.0)  # weights changed in place
        changed = mixer(x)
    assert not torch.allclose(first, changed)
    torch.testing.assert_close(changed, dense_tno(mixer, x), rtol=1e-4, atol=1e-4)
    mixer.train()
    mixer(x)
    assert not mixer._cache.entries  # under autograd nothing is kept


@pytest.mark.parametrize(
    "options, message",
    [
        ({"decay": 1.5}, "decay"),
        ({"decay": 0.0}, "decay"),
        ({"rpe_dim": 0}, "rpe_dim"),
        ({"rpe_layers": -1}, "rpe_layers"),
        ({"activation": "tanh"}, "activation"),
        ({"learnable_decay": True, "decay": 1.0}, "learnable_decay"),
        ({"factored": "no"}, "factored"),
    ],
)
def test_bad_options_raise_value_error(options, message):
    with pytest.raises(ValueError, match=message):
        tokenmix.build_mixer("tno", 4, **options)


def test_registry():
    assert "tno" in tokenmix.list_mixers()
    with pytest.raises(ValueError, match="name must be one of"):
        tokenmix.build_mixer("nope", 4)
    with pytest.raises(ValueError, match="dim"):
        tokenmix.build_mixer("tno", 0)


# the mixers of cached_or_factored_matvec, with small ranks (the interpreter loops over the rank, rpe_dim + 1 or knots + 1)
SMALL_RPE = {"rpe_dim": 8}
FACTORED = [("tno", False, SMALL_RPE), ("tno", True, SMALL_RPE), ("fd_tno", True, SMALL_RPE), ("ski_tno", True, {"knots": 8})]


@RUNS_TRITON
@pytest.mark.parametrize(("name", "causal", "options"), FACTORED)
def test_the_factored_products_of_mixers_run_the_fused_kernels_when_told_with_the_same_results(name, causal, options, monkeypatch):
    """Under ``kernels("fused")`` (in Triton's interpreter off the GPU, conftest.py) the same outputs and gradients as
    under ``kernels("torch")``; that the kernel is reached: outside the interpreter a CPU tensor is then refused, while
    "auto" keeps a CPU tensor on PyTorch's path."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    mixer = tokenmix.build_mixer(name, 20, causal=causal, **options).double().to(device)
    x = torch.randn(2, 100, 20, dtype=torch.float64, device=device, requires_grad=True)
    inputs, grad = [x, *mixer.parameters()], torch.randn_like(x)
    results = {}
    for choice in ("torch", "fused"):
        with kernels(choice):
            y = mixer(x)
            results[choice] = [y, *torch.autograd.grad(y, inputs, grad)]
    for fused, reference in zip(results["fused"], results["torch"], strict=True):
        assert relative_error(fused, reference) < 1e-12
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cpu = mixer.cpu()
    with kernels("fused"), pytest.raises(ValueError, match="the fused kernels run on CUDA tensors"):
        cpu(x.detach().cpu())
    with kernels("torch"):
        expected = cpu(x.detach().cpu())  # on the CPU: cuFFT's float64 differs from the CPU's in the last bits
    with kernels("auto"):
        assert torch.equal(cpu(x.detach().cpu()), expected)


@NEEDS_TRITON
@pytest.mark.parametrize(("triton", "numpy", "works"), [("3.6.0", "2.4.6", False), ("3.7.0", "2.4.0", True), ("3.6.0", "2.3.5", True)])
def test_fused_on_the_cpu_is_refused_in_one_line_where_the_interpreter_fails_with_the_installed_numpy(triton, numpy, works, monkeypatch):
    """Triton's interpreter before 3.7 fails with NumPy 2.4 or later on every loop bounded by a kernel argument (it turns
    one-element arrays into integers, triton-lang/triton issue 9171): the fused kernels on a CPU device are then refused
    with the versions and the fix, and not on a GPU (compiled kernels are not affected)."""
    versions = {"triton": triton, "numpy": numpy}
    monkeypatch.setattr(fused_toeplitz.importlib.metadata, "version", versions.__getitem__)
    monkeypatch.setattr(fused_toeplitz, "INTERPRETER_FAULT", fused_toeplitz.interpreter_fault())  # as found on import
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    fused_toeplitz.check_fused_device("cuda")
    if works:
        assert fused_toeplitz.interpreter_fault() is None
        fused_toeplitz.check_fused_device("cpu")
        return
    expected = "the fused kernels cannot run on cpu: Triton 3.6's interpreter fails with NumPy 2.4 (triton-lang/triton issue 9171)"
    with pytest.raises(ValueError, match=re.escape(f"{expected}: pip install 'triton>=3.7' or 'numpy<2.4'")):
        fused_toeplitz.check_fused_device("cpu")


def test_the_interpreter_check_knows_no_fault_where_triton_goes_by_another_name(monkeypatch):
    """pytorch-triton (torch's nightlies) installs the ``triton`` module under another package name."""

    def version(package: str) -> str:
        if package == "triton":
            raise importlib.metadata.PackageNotFoundError(package)
        return "2.4.6"

    monkeypatch.setattr(fused_toeplitz.importlib.metadata, "version", version)
    assert fused_toeplitz.interpreter_fault() is None


@RUNS_TRITON
@pytest.mark.parametrize("causal", [False, True])
def test_a_compiled_tno_runs_the_fused_kernels_in_its_graph(causal, monkeypatch):
    """Captured whole (``fullgraph``; forward and backward traced by AOTAutograd) with the kernels as custom operators:
    the eager PyTorch path's outputs and gradients, each kernel launched (forward, backward) from the compiled graph."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    mixer = tokenmix.build_mixer("tno", 20, causal=causal, **SMALL_RPE).to(device)
    x = torch.randn(2, 37, 20, device=device, requires_grad=True)
    inputs, grad = [x, *mixer.parameters()], torch.randn_like(x)
    with kernels("torch"):
        y = mixer(x)
        expected = [y, *torch.autograd.grad(y, inputs, grad)]
    launches = []
    launch = fused_toeplitz._launch
    monkeypatch.setattr(fused_toeplitz, "_launch", lambda *args, **kwargs: launches.append(kwargs) or launch(*args, **kwargs))
    torch._dynamo.reset()
    with kernels("fused"):
        y = torch.compile(mixer, fullgraph=True, backend="aot_eager")(x)
        got = [y, *torch.autograd.grad(y, inputs, grad)]
    assert [bool(kwargs.get("conjugate")) for kwargs in launches] == [False, True]
    for compiled, eager in zip(got, expected, strict=True):
        assert relative_error(compiled, eager) < 1e-5


@RUNS_TRITON
def test_auto_runs_the_fused_kernels_only_where_they_proved_themselves(monkeypatch):
    """``fused_ready`` runs one small product both ways on a device, once: on the GPU, else on the CPU through the
    interpreter; a kernel that fails or disagrees there leaves PyTorch's path in force, with a warning that says why."""
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter runs only where no GPU is seen (conftest.py)
    monkeypatch.setattr(toeplitz, "_READY", {})
    assert toeplitz.fused_ready(device) and toeplitz._READY == {device: True}
    launch = fused_toeplitz._launch

    def failing(*args, **kwargs):
        raise RuntimeError("no such device function")

    def wrong(a, basis, readout, **kwargs):
        return launch(a, basis, -readout, **kwargs)

    failures = (
        (failing, f"failed on {device} .RuntimeError: no such device function."),
        (wrong, f"differ from PyTorch's path on {device}"),
    )
    for broken, said in failures:
        monkeypatch.setattr(toeplitz, "_READY", {})
        monkeypatch.setattr(fused_toeplitz, "_launch", broken)
        with pytest.warns(UserWarning, match=f"the fused Toeplitz kernels {said}.*PyTorch's path runs instead"):
            assert not toeplitz.fused_ready(device)
        assert not toeplitz.fused_ready(device)  # asked once


def test_the_probe_before_compiling_tries_the_kernels_only_where_auto_may_run_them(monkeypatch):
    """``probe_fused_kernels`` (``--compile``) on a CUDA device with triton: under "auto" only; "torch" rules the kernels
    out, and "fused" runs them unasked."""
    asked = []
    monkeypatch.setattr(toeplitz, "fused_ready", asked.append)
    monkeypatch.setattr(toeplitz, "triton_available", lambda: True)
    for choice in ("torch", "fused", "auto"):
        with kernels(choice):
            toeplitz.probe_fused_kernels("cuda")
    toeplitz.probe_fused_kernels("cpu")
    assert asked == ["cuda"]


@RUNS_TRITON
def test_the_fused_kernels_custom_operators_pass_opcheck():
    """What ``torch.compile`` relies on: schemas, fake (shape-only) versions that agree with the kernels, AOT dispatch."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    spectra = [torch.randn(2, 20, 9, dtype=torch.complex64, device=device) for _ in range(2)]
    basis, readout = torch.randn(4, 9, dtype=torch.complex64, device=device), torch.randn(4, 20, device=device)
    for conjugate in (False, True):
        torch.library.opcheck(fused_toeplitz._product_op, (spectra[0], basis, readout, conjugate))
    for want_product in (False, True):
        torch.library.opcheck(fused_toeplitz._product_and_sum_op, (*spectra, basis, readout, want_product))


# Compiles the kernel with a launch's signature (pointers of the spectrum's real dtype, the ints unspecialised, the
# flags and tile as constants: the largest tile and one of a few channels and frequencies) for CUDA architectures,
# here without a GPU: Triton's compiler down to ptxas, which its interpreter never runs.
COMPILE_FOR_GPUS = """
import sys, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tokenmix.ops.fused_toeplitz import FP_FUSION, _kernel
_, kernel = _kernel()
for capability, real, tile in (("80", "fp32", (16, 64)), ("90", "fp32", (16, 64)), ("90", "fp32", (2, 4)), ("90", "fp64", (16, 64)),
                               ("100", "fp32", (16, 64))):
    signature = {name: "*" + real if name.endswith("_ptr") else "constexpr" if name.isupper() else "i32" for name in kernel.arg_names}
    for conjugate, product, total in ((False, True, False), (True, True, True), (True, False, True), (True, True, False)):
        flags = dict(CONJUGATE=conjugate, PRODUCT=product, SUM=total, BLOCK_C=tile[0], BLOCK_F=tile[1])
        target, options = GPUTarget("cuda", int(capability), 32), {"enable_fp_fusion": FP_FUSION}
        compiled = triton.compile(ASTSource(kernel, signature, flags), target, options)
        print(capability, real, conjugate, product, total, len(compiled.asm["cubin"]))
"""


@NEEDS_TRITON
def test_the_fused_kernel_compiles_for_ampere_hopper_and_blackwell_gpus(tmp_path):
    """Each form of the kernel the products launch, in float32 and float64, with the largest tile and a small one,
    compiled to a cubin for sm_80, sm_90 and sm_100 (in a process without TRITON_INTERPRET, with an empty kernel cache):
    what the interpreter's tests cannot check (types the compiler infers, loop-carried values, what the backends
    lower)."""
    cubins = compiled_for_gpus(COMPILE_FOR_GPUS, tmp_path)
    assert len(cubins) == 20 and all(int(size) > 0 for *_, size in cubins)
