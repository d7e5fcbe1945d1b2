"""Measure decoding: a causal LM model at a position P, and a Toeplitz mixer token by token.

``measure_generate``: one prefill call of P tokens builds the state at position P (timed once, after
a stream of a few tokens has paid the process's first-call costs); single-token steps from it are
timed (median after warm-up; each step moves the position on by one) against recomputing one
forward over the P + 1 tokens without a state, where P <= recompute_max; the steps at P alternate with
steps from a second state at position 256 (``step_ratio``: is a step's cost flat in the position?) and,
for a model that decodes from static buffers, with the steps of a ``StaticDecoder`` made from the
state at P (``static_step_ms``: a CUDA graph's replay on CUDA, the static step run eagerly elsewhere).
Recurrent models (Transformer-XL, FNetAR-XL) stream with segments of ``GENERATE_SEGMENT`` tokens.

``measure_generate_mixer``: L inputs decoded one by one with ``mixer.step`` (a Toeplitz mixer's tiled
relaxed products by FFT; the ``ssm``'s recurrence) and with the direct product over the whole history
(``naive_online_step``), each once, timed in windows of doubling length. The taps of both are computed before the clock starts;
the direct run stops after ``direct_max_seconds`` and says how far it got.
"""

from __future__ import annotations

import time

import torch

from ..generation.graphs import StaticDecoder
from ..ops.online_toeplitz import naive_online_step
from .cases import Case
from .records import GenerateMeasurement, MixerGenerateMeasurement, identity
from .timing import WARMUP, alternating_medians, median_ms, sync, time_tokens

REFERENCE_POSITION = 256  # the position whose step each generate case's step is compared with (step_ratio)


def measure_generate(case: Case, repeats: int = 7) -> GenerateMeasurement:
    model, tokens = case.build()  # (batch, P + 1)
    model.eval()
    device, position = tokens.device, case.length
    reference = min(REFERENCE_POSITION, position)
    recompute = position <= case.limits.get("recompute_max", position)
    with torch.no_grad():

        def empty(length: int):
            return model.init_state(case.batch, max_length=length + WARMUP + repeats)

        model(tokens[:, :8], state=model.init_state(case.batch), return_state=True)  # first-call costs
        state = empty(position)
        sync(device)
        start = time.perf_counter()
        _, state = model(tokens[:, :position], state=state, return_state=True)
        sync(device)
        prefill_ms = (time.perf_counter() - start) * 1e3
        state_bytes = state.nbytes()
        static = model.static_decoding
        if static:  # from a copy of the state at P, on to as many tokens as the stream steps
            decoder = StaticDecoder(model, state, position + WARMUP + repeats)  # a CUDA graph on CUDA
        states = [state, model(tokens[:, :reference], state=empty(reference), return_state=True)[1]]
        next_tokens = [tokens[:, position:], tokens[:, reference : reference + 1]]

        def stepper(index: int):
            def step():
                _, states[index] = model(next_tokens[index], state=states[index], return_state=True)

            return step

        steppers = [stepper(0), stepper(1)] + ([lambda: decoder.step(next_tokens[0][:, 0])] if static else [])
        step_ms, reference_ms, *static_ms = alternating_medians(steppers, device, repeats)
        recompute_ms = median_ms(lambda: model(tokens), device, repeats) if recompute else None
    return GenerateMeasurement(
        **identity(case, device),
        prefill_ms=prefill_ms,
        step_ms=step_ms,
        state_bytes=state_bytes,
        recompute_ms=recompute_ms,
        recompute_ratio=recompute_ms / step_ms if recompute else None,
        recompute_skipped=not recompute,
        step_ratio=step_ms / reference_ms,
        static_step_ms=static_ms[0] if static else None,
        static_speedup=step_ms / static_ms[0] if static else None,
    )


def measure_generate_mixer(case: Case) -> MixerGenerateMeasurement:
    mixer, inputs = case.build()  # (batch, L, dim)
    mixer.eval()
    device, length = inputs.device, case.length
    with torch.no_grad():
        taps = mixer.kernel(length)
        mixer.step(inputs, mixer.init_state(case.batch, max_length=length))  # warm-up: computes and caches the tiles' taps
        state = mixer.init_state(case.batch, max_length=length)

        def tiled(t: int) -> torch.Tensor:
            nonlocal state
            y, state = mixer.step(inputs[:, t : t + 1], state)
            return y[:, 0]

        tiled_run = time_tokens(tiled, length, device)
        direct_run = time_tokens(
            lambda t: naive_online_step(inputs[:, : t + 1], taps), length, device, case.limits.get("direct_max_seconds")
        )
    pairs = [
        (a, b)
        for window, a, other, b in zip(tiled_run.windows, tiled_run.outputs, direct_run.windows, direct_run.outputs, strict=False)
        if window["to"] == other["to"]
    ]
    finished = direct_run.tokens == length
    return MixerGenerateMeasurement(
        **identity(case, device),
        tiled_s=tiled_run.total_ms / 1e3,
        direct_s=direct_run.total_ms / 1e3,
        direct_tokens=direct_run.tokens,
        direct_finished=finished,
        direct_ratio=direct_run.total_ms / tiled_run.total_ms if finished else None,
        max_abs_diff=max(float((a.float() - b.float()).abs().max()) for a, b in pairs) if pairs else None,
        tiled_curve=tiled_run.windows,
        direct_curve=direct_run.windows,
    )
