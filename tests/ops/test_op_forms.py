"""Every op's forms against each other (``tokenmix/ops/forms.py``): the naive definition, the parallel fast
path and, where the op streams, the recurrent decoder, on outputs, final states and every gradient.

One parametrized test over ``list_ops()``: an op is covered by registering its forms; another holds an op's fused
(Triton) form to its naive one, on the GPU, or on the CPU through Triton's interpreter (``conftest.py``).
"""

import pytest
import torch
from conftest import LENGTHS, RUNS_TRITON

from tokenmix.ops import list_ops, op_forms

FORMS = ("naive", "parallel", "recurrent")
DECODED = 64  # past 128 tokens the recurrent form decodes the last 64 after a prefill (see decoded_after_prefill)


def tensors(value) -> list[torch.Tensor]:
    """The floating-point tensors in a state or a params dict (a tensor, tuple or dict of them)."""
    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() else []
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (tuple, list)) else []
    return [tensor for item in items for tensor in tensors(item)]


def run_form(form, x, params, state):
    """(y, final state, the gradients of one fixed random functional of both w.r.t. x, params and the initial state)."""
    leaves = [x, *tensors(params), *tensors(state)]
    y, final = form(x, params, state, True) if state is not None else (form(x, params), None)
    weights = torch.Generator().manual_seed(1)  # the same functional for every form: the outputs share their shapes
    loss = sum((t * torch.randn(t.shape, dtype=t.dtype, generator=weights).to(t.device)).sum() for t in [y, *tensors(final)])
    return y, final, torch.autograd.grad(loss, leaves, allow_unused=True)


def decoded_after_prefill(forms):
    """The recurrent form as a decoder runs it: the parallel form's final state of all but the last ``DECODED``
    tokens (a prompt in one call), then the recurrent form token by token over the rest; differentiable
    throughout. At 1000 and 1024 tokens from scratch it would step a Python loop over every token (relative
    attention's: 12 s a case); from scratch it runs at 1, 7, 64 and 100 tokens, and every causal mixer's and
    model's stream steps token by token past 500 tokens in ``test_streaming`` (``test_online_toeplitz``: the
    online Toeplitz product at every length)."""

    def run(x, params, state, output_final_state):
        prompt = x.shape[1] - DECODED
        head, middle = forms.parallel(x[:, :prompt], params, state, True)
        tail, final = forms.recurrent(x[:, prompt:], params, middle, True)
        return torch.cat([head, tail], dim=1), final

    return run


@pytest.mark.parametrize("name", list_ops())
@pytest.mark.parametrize("n", [*LENGTHS, 64])
def test_every_form_of_an_op_agrees_on_outputs_final_states_and_gradients(name, n):
    """Each form against the naive one at every length. Past 128 tokens one row (two rows kept apart are checked
    at 1, 7, 64 and 100 tokens; a naive form loops over rows, relative attention's over every query too) and
    the recurrent form after a prefill (``decoded_after_prefill``)."""
    forms = op_forms(name)
    x, params, state = forms.example(1 if n > 128 else 2, n, 3, torch.float64, torch.Generator().manual_seed(n))
    for leaf in [x, *tensors(params), *tensors(state)]:
        leaf.requires_grad_(True)
    naive_y, naive_final, naive_grads = run_form(forms.naive, x, params, state)
    for form_name in FORMS[1:]:
        form = getattr(forms, form_name)
        if form is None:
            continue
        if form_name == "recurrent" and n > 128:
            form = decoded_after_prefill(forms)
        y, final, grads = run_form(form, x, params, state)
        torch.testing.assert_close(y, naive_y, msg=lambda m, where=f"{name} {form_name} output": f"{where}: {m}")
        torch.testing.assert_close(final, naive_final, msg=lambda m, where=f"{name} {form_name} final state": f"{where}: {m}")
        for index, (got, expected) in enumerate(zip(grads, naive_grads, strict=True)):
            zero = torch.zeros_like(got if got is not None else expected)
            where = f"{name} {form_name} gradient of leaf {index}"
            torch.testing.assert_close(
                zero if got is None else got, zero if expected is None else expected, msg=lambda m, w=where: f"{w}: {m}"
            )


@pytest.mark.parametrize("name", [name for name in list_ops() if op_forms(name).streams])
def test_continuing_from_a_final_state_gives_the_whole_sequence(name):
    """Each form, given the final state of a prefix, continues it: the outputs of the sequence in one call."""
    forms = op_forms(name)
    x, params, state = forms.example(2, 40, 3, torch.float64, torch.Generator().manual_seed(0))
    for form_name in FORMS:
        form = getattr(forms, form_name)
        whole, whole_final = form(x, params, state, True)
        head, middle = form(x[:, :17], params, state, True)
        tail, final = form(x[:, 17:], params, middle, True)
        torch.testing.assert_close(torch.cat([head, tail], dim=1), whole)
        torch.testing.assert_close(final, whole_final)


FUSED_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # on the CPU, Triton's interpreter (see conftest.py)


@RUNS_TRITON
@pytest.mark.parametrize("name", [name for name in list_ops() if op_forms(name).fused is not None])
@pytest.mark.parametrize("n", LENGTHS)
def test_the_fused_form_of_an_op_agrees_with_its_naive_form_on_outputs_and_gradients(name, n):
    """The fused form on FUSED_DEVICE against the naive one on the CPU, float64, at every length; two rows and 20
    channels (a kernel's tile is 16 channels by 64 frequencies: a whole tile and a part of one, and frequencies past
    one tile from 100 tokens), small enough for the interpreter to take seconds."""
    forms = op_forms(name)
    x, params, state = forms.example(2, n, 20, torch.float64, torch.Generator().manual_seed(n))
    for leaf in [x, *tensors(params)]:
        leaf.requires_grad_(True)
    naive_y, _, naive_grads = run_form(forms.naive, x, params, state)
    on_device = {key: value.detach().to(FUSED_DEVICE).requires_grad_(True) for key, value in params.items()}
    y, _, grads = run_form(forms.fused, x.detach().to(FUSED_DEVICE).requires_grad_(True), on_device, state)
    torch.testing.assert_close(y.cpu(), naive_y, msg=lambda m: f"{name} fused output: {m}")
    for index, (got, expected) in enumerate(zip(grads, naive_grads, strict=True)):
        torch.testing.assert_close(got.cpu(), expected, msg=lambda m, i=index: f"{name} fused gradient of leaf {i}: {m}")
