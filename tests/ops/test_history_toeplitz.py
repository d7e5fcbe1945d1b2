"""The static decoding step's history product (``ops/history_toeplitz.py``): PyTorch's form and the fused (Triton) form
against the definition, on the GPU or on the CPU through Triton's interpreter (``conftest.py``)."""

import pytest
import torch
from conftest import LENGTHS, NEEDS_TRITON, RUNS_TRITON, compiled_for_gpus, relative_error

from tokenmix.ops import history_toeplitz, toeplitz
from tokenmix.ops.history_toeplitz import history_product, naive_history_product

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # on the CPU the fused form runs in Triton's interpreter


def stream_buffers(capacity: int, positions: list[int], dim: int, dtype=torch.float64):
    """Buffers of streams standing at ``positions`` (their inputs so far, zeros past them), a new input per row, taps."""
    inputs = torch.zeros(len(positions), capacity, dim, dtype=dtype, device=DEVICE)
    for row, position in enumerate(positions):
        inputs[row, :position] = torch.randn(position, dim, dtype=dtype)
    x = torch.randn(len(positions), dim, dtype=dtype, device=DEVICE)
    return inputs, torch.tensor(positions, device=DEVICE), x, torch.randn(capacity, dim, dtype=dtype, device=DEVICE)


@pytest.mark.parametrize("capacity", LENGTHS)
@pytest.mark.parametrize("fused", [pytest.param(False, id="torch"), pytest.param(True, marks=RUNS_TRITON, id="fused")])
def test_each_form_gives_the_definitions_outputs_and_writes_its_buffer(capacity, fused):
    """Rows at the first position, the last, and one inside (the fused form's blocks of lags: a partial one); 48
    channels (two blocks of channels, one partial)."""
    positions = sorted({0, capacity // 2, capacity - 1})
    inputs, position, x, taps = stream_buffers(capacity, positions, 48)
    expected_buffer = inputs.clone()
    expected = naive_history_product(expected_buffer, position, x, taps)
    y = history_product(inputs, position, x, taps, fused=fused)
    assert relative_error(y, expected) < 1e-12
    assert torch.equal(inputs, expected_buffer)
    assert position.tolist() == positions  # the caller advances the positions


@RUNS_TRITON
def test_the_fused_form_casts_the_input_to_the_buffers_dtype_and_reads_no_history_past_the_position():
    """A bfloat16 input into float32 buffers (autocast's decoding); the buffer past each row's position full of values
    the PyTorch form would read (a stream's buffer holds zeros there): the fused form sums the live history only."""
    inputs, position, x, taps = stream_buffers(300, [5, 200], 40, dtype=torch.float32)
    x = x.bfloat16()
    expected = naive_history_product(inputs.clone(), position, x, taps)
    inputs[0, 6:] = inputs[1, 201:] = 1e6
    y = history_product(inputs, position, x, taps, fused=True)
    assert y.dtype == torch.float32 and relative_error(y, expected) < 1e-6
    assert torch.equal(torch.stack([inputs[0, 5], inputs[1, 200]]), x.float())


@RUNS_TRITON
def test_the_fused_form_touches_nothing_of_a_row_past_its_buffer():
    """A position at the capacity or before the buffer (a caller's error; PyTorch's form raises an IndexError at the
    first) writes no memory and gives zeros; the other rows step as they would alone."""
    inputs, _, x, taps = stream_buffers(16, [3, 9, 5], 8)
    position = torch.tensor([16, 9, -1], device=DEVICE)
    expected = inputs.clone()
    alone = naive_history_product(expected[1:2], position[1:2], x[1:2], taps)
    y = history_product(inputs, position, x, taps, fused=True)
    assert torch.equal(inputs, expected)  # row 0's slot 16 would be row 1's first, row 2's slot -1 row 1's last
    assert relative_error(y[1:2], alone) < 1e-12 and not y[[0, 2]].any()
    with pytest.raises(IndexError):
        history_product(inputs.cpu(), torch.tensor([16, 9, 5]), x.cpu(), taps.cpu(), fused=False)


@pytest.mark.parametrize("fused", [pytest.param(False, id="torch"), pytest.param(True, marks=RUNS_TRITON, id="fused")])
def test_shapes_that_do_not_fit_are_refused_with_the_argument_named(fused):
    inputs, position, x, taps = stream_buffers(16, [3, 9], 8)
    wrong = {
        "inputs must be .batch, capacity, dim.": (inputs[0], position, x, taps),
        r"position must be \(2,\) int64": (inputs, position.int(), x, taps),
        r"x must be \(2, 8\)": (inputs, position, x[:, :4], taps),
        r"taps must be \(lags >= 16, 8\)": (inputs, position, x, taps[:15]),
    }
    for message, arguments in wrong.items():
        with pytest.raises(ValueError, match=message):
            history_product(*arguments, fused=fused)


@RUNS_TRITON
def test_the_probe_asked_first_under_inference_mode_keeps_the_fused_kernels(monkeypatch):
    """A decoding step under ``torch.inference_mode`` may be the first to ask ``fused_ready``: its probe differentiates."""
    monkeypatch.setattr(toeplitz, "_READY", {})
    with torch.inference_mode():
        assert toeplitz.fused_ready(DEVICE)


@RUNS_TRITON
def test_the_fused_forms_custom_operator_passes_opcheck():
    """What ``torch.compile`` relies on: the schema (the buffer it writes), the fake version, AOT dispatch."""
    inputs, position, x, taps = stream_buffers(70, [0, 69], 20, dtype=torch.float32)
    torch.library.opcheck(history_toeplitz._history_op, (inputs, position, x, taps))


@RUNS_TRITON
def test_the_probe_of_the_fused_kernels_finds_a_broken_history_kernel(monkeypatch):
    """``fused_ready`` checks the history kernel too: a wrong one leaves PyTorch's path in force, with the reason."""
    operator = history_toeplitz._history_op
    monkeypatch.setattr(toeplitz, "_READY", {})
    monkeypatch.setattr(history_toeplitz, "_history_op", lambda inputs, position, x, taps: operator(inputs, position, -x, taps))
    with pytest.warns(UserWarning, match=f"the fused Toeplitz kernels differ from PyTorch's path on {DEVICE}"):
        assert not toeplitz.fused_ready(DEVICE)


# The history kernel compiled with a launch's signature (the buffers' real dtype, positions int64, the input in the
# buffers' dtype or bfloat16, the ints unspecialised) for CUDA architectures: a loop whose bound is read from memory.
COMPILE_FOR_GPUS = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tokenmix.ops.fused_toeplitz import FP_FUSION
from tokenmix.ops.history_toeplitz import _BLOCK_CHANNELS, _BLOCK_LAGS, _kernel
_, kernel = _kernel()
for capability in (80, 90, 100):
    for real, given in (("fp32", "fp32"), ("fp32", "bf16"), ("fp64", "fp64")):
        signature = {"inputs_ptr": "*" + real, "position_ptr": "*i64", "x_ptr": "*" + given, "taps_ptr": "*" + real,
                     "partial_ptr": "*" + real}
        signature |= {name: "constexpr" if name.isupper() else "i32" for name in kernel.arg_names if name not in signature}
        tile = {"BLOCK_S": _BLOCK_LAGS, "BLOCK_D": _BLOCK_CHANNELS}
        compiled = triton.compile(ASTSource(kernel, signature, tile), GPUTarget("cuda", capability, 32), {"enable_fp_fusion": FP_FUSION})
        print(capability, real, given, len(compiled.asm["cubin"]))
"""


@NEEDS_TRITON
def test_the_history_kernel_compiles_for_ampere_hopper_and_blackwell_gpus(tmp_path):
    cubins = compiled_for_gpus(COMPILE_FOR_GPUS, tmp_path)
    assert len(cubins) == 9 and all(int(size) > 0 for *_, size in cubins)
