"""Mixed precision over the registries (``tokenmix.precision``, ``SequenceModel.precision``, ``--precision``).

The device is ``TOKENMIX_TEST_DEVICE`` (default "cpu"): a lent GPU runs this module with "cuda", where
autocast casts other operations than on the CPU.
"""

import os
import warnings
from dataclasses import replace

import pytest
import torch
from conftest import LENGTHS, random_chunks, relative_error
from test_contracts import LM_MODELS, MODEL_TASKS, MODES, mixer, model
from test_train import tiny_config

from tokenmix import precision as precision_module
from tokenmix.bench.accuracy import autocast_errors
from tokenmix.precision import PRECISIONS, autocast, check_precision, compute_dtype, emulated_on_this_cpu
from tokenmix.runs.checkpoint import load_checkpoint
from tokenmix.train import Trainer

DEVICE = torch.device(os.environ.get("TOKENMIX_TEST_DEVICE", "cpu"))
pytestmark = pytest.mark.skipif(DEVICE.type == "cuda" and not torch.cuda.is_available(), reason="TOKENMIX_TEST_DEVICE=cuda needs a GPU")
HALF = ["bf16", "fp16"]
# relative error against float64 on the same (rounded) input: bf16 keeps 8 bits, fp16 11; the worst mixer
# measured on the CPU gave 1.3e-2 (bf16) and 1.3e-3 (fp16), a gradient of relative attention's position bias
FLOAT64_TOLERANCE = {"bf16": 3e-2, "fp16": 4e-3}


def half_input(n: int, dim: int, precision: str) -> torch.Tensor:
    return torch.randn(2, n, dim, device=DEVICE).to(compute_dtype(precision))


@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize(
    ("name", "causal"), [(name, causal) for name, causal in MODES if mixer(name, causal).inner_precision != "autocast"]
)
def test_a_mixer_that_computes_in_float32_or_its_input_dtype_does_so_under_autocast(name, causal, n, precision):
    """Under autocast its output is, bit for bit, what it computes with autocast off on the input its
    ``inner_precision`` names (float32, or the input as it is), cast back to the input's dtype."""
    layer = mixer(name, causal).to(DEVICE)
    x = half_input(n, layer.dim, precision)
    with autocast(precision, DEVICE):
        y = layer(x)
    inner = x.float() if layer.inner_precision == "float32" else x
    assert y.dtype == x.dtype
    assert torch.equal(y, layer(inner).to(x.dtype))


@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize(("name", "causal"), MODES)
def test_a_mixer_under_autocast_keeps_its_input_dtype_and_the_float64_numbers(name, causal, n, precision):
    """Output, input gradient and parameter gradients against the float64 module on the same rounded input
    (``bench.accuracy``, which ``tokenmix bench --kinds precision`` tabulates)."""
    layer = mixer(name, causal).to(DEVICE)
    x = half_input(n, layer.dim, precision)
    with autocast(precision, DEVICE):
        assert layer(x).dtype == x.dtype
    for kind, error in autocast_errors(layer, x, precision).items():
        assert error is None or error < FLOAT64_TOLERANCE[precision], (kind, error)


@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize(("name", "task"), MODEL_TASKS)
def test_every_model_trains_in_each_precision_with_float32_parameters_and_optimizer_state(name, task, precision):
    """Five AdamW steps on one batch (fp16 with loss scaling): the loss falls, logits come out in float32,
    parameters, gradients and optimizer state stay float32."""
    torch.manual_seed(0)
    network = model(name, task).to(DEVICE)
    network.precision = precision
    optimizer = torch.optim.AdamW(network.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler(DEVICE.type, enabled=precision == "fp16")
    tokens = torch.randint(0, 20, (4, 24), device=DEVICE)
    labels = torch.randint(0, 3, (4,), device=DEVICE)
    losses = []
    for _ in range(5):
        logits = network(tokens)
        assert logits.dtype == torch.float32
        if task == "classify":
            loss = torch.nn.functional.cross_entropy(logits, labels)
        else:
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert all(p.dtype == torch.float32 and (p.grad is None or p.grad.dtype == torch.float32) for p in network.parameters())
    assert all(value.dtype == torch.float32 for state in optimizer.state.values() for value in state.values() if value.is_floating_point())


@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("name", LM_MODELS)
def test_a_stream_in_mixed_precision_gives_the_forward_in_mixed_precision(name, precision):
    """Chunks of any sizes through ``step`` under autocast give one forward's logits under autocast, to the
    compute dtype's rounding; the state keeps the dtype it was made in."""
    network = model(name).to(DEVICE).eval()
    network.precision = precision
    tokens = torch.randint(0, 20, (2, 100), device=DEVICE)
    with torch.no_grad():
        whole = network(tokens)
        state, pieces = network.init_state(2), []
        for chunk in random_chunks(tokens.shape[1], seed=1):
            logits, state = network(tokens[:, chunk], state=state, return_state=True)
            pieces.append(logits)
    assert state.floating_dtypes <= {torch.float32}
    assert relative_error(torch.cat(pieces, dim=1), whole) < FLOAT64_TOLERANCE[precision]


def test_a_precision_is_one_of_the_three_and_float32_runs_without_autocast():
    assert list(PRECISIONS) == ["fp32", "bf16", "fp16"]
    with pytest.raises(ValueError, match=r"precision must be one of \['fp32', 'bf16', 'fp16'\], got 'fp8'"):
        check_precision("fp8")
    network = model("tnn")
    with pytest.raises(ValueError, match="precision must be one of"):
        network.precision = "float16"
    with autocast("fp32", "cpu"):
        assert not torch.is_autocast_enabled("cpu")
    with autocast("bf16", torch.zeros(1)):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_half_precision_on_a_cpu_without_its_instructions_is_said_to_run_emulated(precision, tmp_path, monkeypatch):
    """Read from the CPU's flags (``/proc/cpuinfo``): a CPU with AVX-512 or AMX for the type computes it natively; one
    without is told once, at the autocast, that its products run emulated; where the flags cannot be read, nothing."""
    native, plain = tmp_path / "native", tmp_path / "plain"
    native.write_text(f"processor\t: 0\nflags\t\t: fpu sse avx512f {precision_module.NATIVE_CPU_FLAGS[precision][1]}\n")
    plain.write_text("processor\t: 0\nflags\t\t: fpu sse avx512f avx512bw\n")
    assert not emulated_on_this_cpu(precision, native) and emulated_on_this_cpu(precision, plain)
    assert not emulated_on_this_cpu(precision, tmp_path / "absent")
    monkeypatch.setattr(precision_module, "_CHECKED_CPU", set())  # inside a compiled region: not looked up (no file read)

    def under_autocast(x):
        with autocast(precision, "cpu"):
            return x @ x

    torch._dynamo.reset()
    x = torch.randn(4, 4)
    assert torch.equal(torch.compile(under_autocast, fullgraph=True, backend="eager")(x), under_autocast(x))
    monkeypatch.setattr(precision_module, "emulated_on_this_cpu", lambda precision: True)
    monkeypatch.setattr(precision_module, "_CHECKED_CPU", set())
    said = f"{precision} on this CPU: it lacks .* so the matrix products run emulated"
    with pytest.warns(UserWarning, match=said), autocast(precision, "cpu"):
        pass
    with warnings.catch_warnings():  # told once
        warnings.simplefilter("error")
        with autocast(precision, "cpu"):
            pass
    monkeypatch.setattr(precision_module, "_CHECKED_CPU", set())
    monkeypatch.setattr(precision_module, "emulated_on_this_cpu", lambda precision: False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with autocast(precision, "cpu"), autocast("fp32", "cpu"):
            pass


def test_a_copy_with_other_options_keeps_the_precision():
    network = model("transformer_xl", segment_length=8)
    network.precision = "bf16"
    assert network.with_options(segment_length=4).precision == "bf16"


@pytest.mark.parametrize("precision", HALF)
def test_a_run_records_its_precision_resumes_exactly_in_it_and_refuses_another(text_file, tmp_path, precision):
    """Six steps at once, and three saved then resumed, end with the same weights and (fp16) loss scale; a resume
    asking for another precision is refused naming both."""
    config = tiny_config(text_file, tmp_path / "whole", precision=precision, device=str(DEVICE))
    whole = Trainer(config, progress=False)
    whole.run()
    split = replace(config, out=str(tmp_path / "split"))
    interrupted = Trainer(split, progress=False)
    for _ in range(3):
        interrupted.train_step()
    interrupted.save()
    interrupted.release_lock()  # killed here: the kernel drops its lock
    resumed = Trainer(split, resume=True, progress=False)
    resumed.run()
    saved = load_checkpoint(tmp_path / "split" / "checkpoint.pt")
    assert saved["train_config"]["precision"] == precision
    assert saved["grad_scaler"] == resumed.scaler.state_dict() == whole.scaler.state_dict()
    assert bool(saved["grad_scaler"]) == (precision == "fp16")
    for (key, a), b in zip(whole.model.state_dict().items(), resumed.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), key
    with pytest.raises(ValueError, match=f"precision: checkpoint '{precision}', given 'fp32'"):
        Trainer(replace(split, precision="fp32", steps=9), resume=True, progress=False)


def test_fp16_is_refused_under_fsdp_with_the_reason(text_file, tmp_path):
    with pytest.raises(ValueError, match="precision 'fp16' with --fsdp: fp16 needs a loss scaler"):
        tiny_config(text_file, tmp_path, precision="fp16", fsdp=True)
