"""Decoding from static buffers (``static_state``, ``static_step``; ``tokenmix.generation.graphs``), over the registries.

Every causal mixer and language model that declares ``static_decoding`` is held to its parallel forward (mixers) or
to its stream ``step`` (models), from a prefill of half the stream, one static step per token after it; the others
refuse. On the CPU the static step runs eagerly: the same code a CUDA graph captures (``tests/test_cuda.py`` replays
it as one on a GPU).
"""

import pytest
import torch
from conftest import LENGTHS, RUNS_TRITON, OperatorsCalled, history_kernel_launches, host_made_tensors, relative_error
from test_contracts import CAUSAL, LM_MODELS, mixer, model
from torch._dynamo.utils import counters

from tokenmix.generation import StaticDecoder, generate
from tokenmix.generation.graphs import use_static_decoding
from tokenmix.ops.fused_toeplitz import kernels

STATIC_MIXERS = [name for name in CAUSAL if mixer(name, True).static_decoding]
TOEPLITZ_MIXERS = [name for name in STATIC_MIXERS if mixer(name, True).toeplitz_streaming]


def test_every_language_model_decodes_from_static_buffers():
    """Every causal mixer steps from fixed buffers but relative attention (a context that grows with every input); inside
    a Transformer-XL block it mixes a window of fixed length from positions on the device (``static_context``), as FNetAR
    does there, so every language model does; a model built with relative attention outside such a block does not."""
    assert sorted(set(CAUSAL) - set(STATIC_MIXERS)) == ["relative_attention"]
    assert all(mixer(name, True).static_context for name in ("fnet_ar", "relative_attention"))
    assert all(model(name).static_decoding for name in LM_MODELS)
    assert model("tnn", mixer="fnet_ar").static_decoding and not model("tnn", mixer="relative_attention").static_decoding


def static_stream(module, x: torch.Tensor, prefill: int, capacity: int) -> torch.Tensor:
    """x's outputs: the first ``prefill`` by ``step``, the rest one ``static_step`` per token from its static state."""
    state = module.init_state(x.shape[0], max_length=capacity, dtype=x.dtype)  # x's: a mixer without weights has no dtype
    y, state = module.step(x[:, :prefill], state)
    static = module.static_state(state, capacity)
    return torch.cat([y, *(module.static_step(x[:, t : t + 1], static) for t in range(prefill, x.shape[1]))], dim=1)


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("name", STATIC_MIXERS)
def test_static_steps_after_a_prefill_equal_the_forward(name, length):
    module = mixer(name, True).double().eval()
    x = torch.randn(2, length, module.dim, dtype=torch.float64)
    capacity = length + 3  # room to spare: the buffers past the stream stay unread
    with torch.no_grad():  # a causal forward over the capacity: fd_tno's operator is that of its horizon, the capacity
        expected = module(torch.nn.functional.pad(x, (0, 0, 0, capacity - length)))[:, :length]
        got = static_stream(module, x, max(1, length // 2), capacity)
    assert relative_error(got, expected) < 1e-10


@pytest.mark.parametrize("name", STATIC_MIXERS)
def test_a_static_step_keeps_its_buffers_and_rows_at_their_own_positions(name):
    """The state's tensors are written in place (a graph reads the same memory at every step), and a batch whose rows
    stand at different positions steps each as it would alone."""
    module = mixer(name, True).double().eval()
    x = torch.randn(2, 12, module.dim, dtype=torch.float64)
    with torch.no_grad():
        rows = [
            module.static_state(module.step(x[r : r + 1, : 3 + 4 * r], module.init_state(1, max_length=16, dtype=x.dtype))[1], 16)
            for r in (0, 1)
        ]
        both = type(rows[0]).concat(rows)
        pointers = [tensor.data_ptr() for tensor in both.tensors()]
        outputs = module.static_step(torch.stack([x[0, 3], x[1, 7]])[:, None], both)
        alone = [module.static_step(x[r : r + 1, 3 + 4 * r][:, None], rows[r]) for r in (0, 1)]
    assert [tensor.data_ptr() for tensor in both.tensors()] == pointers
    assert relative_error(outputs, torch.cat(alone)) < 1e-12


@RUNS_TRITON
@pytest.mark.parametrize("name", TOEPLITZ_MIXERS)
def test_a_toeplitz_mixer_steps_its_buffers_by_the_fused_kernel_eagerly_and_compiled(name, monkeypatch):
    """Under ``kernels("fused")`` (Triton's interpreter off the GPU) rows at their own positions step to the outputs and
    buffers of PyTorch's form; compiled whole through AOTAutograd, once for every position, the kernel launched at each
    step (its declared write into the buffer: ``tests/ops/test_history_toeplitz.py``'s opcheck)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter runs only where no GPU is seen (conftest.py)
    module = mixer(name, True).eval().to(device)
    x = torch.randn(2, 20, module.dim, device=device)
    launches = history_kernel_launches(monkeypatch)
    with torch.no_grad():
        states = [module.step(x[:, :6], module.init_state(2, max_length=32, device=device))[1] for _ in range(3)]
        expected, eager, compiled = (module.static_state(state, 32) for state in states)
        expected.position[1] += 3  # the second row three tokens ahead (its inputs there zeros)
        eager.position[1] += 3
        compiled.position[1] += 3
        torch._dynamo.reset()
        counters.clear()
        step = torch.compile(module.static_step, fullgraph=True, backend="aot_eager")
        for t in range(6, 20):
            with kernels("torch"):
                reference = module.static_step(x[:, t : t + 1], expected)
            with kernels("fused"):
                assert relative_error(module.static_step(x[:, t : t + 1], eager), reference) < 1e-5
                assert relative_error(step(x[:, t : t + 1], compiled), reference) < 1e-5
    assert [positions for _, positions in launches] == [[t, t + 3] for t in range(6, 20) for _ in range(2)]
    assert counters["stats"]["unique_graphs"] == 1
    for state in (eager, compiled):
        assert relative_error(state.inputs, expected.inputs) < 1e-6 and torch.equal(state.position, expected.position)


@pytest.mark.parametrize("name", sorted(set(CAUSAL) - set(STATIC_MIXERS)))
def test_a_mixer_without_static_buffers_refuses_them(name):
    module = mixer(name, True)
    with pytest.raises(ValueError, match="does not decode from static buffers"):
        module.static_state(module.init_state(1, max_length=8), 8)


DISTILLED_WINDOW = ("tnn", {"mixer": {"name": "ssm", "order": 4, "window": 2}})  # a distilled model: modes and free taps
FNET_AR_ALONE = ("tnn", {"mixer": {"name": "fnet_ar", "window": 4}})  # FNetAR's window outside a Transformer-XL block


@pytest.mark.parametrize(("name", "options"), [(name, {}) for name in LM_MODELS] + [DISTILLED_WINDOW, FNET_AR_ALONE])
def test_a_model_decoded_from_static_buffers_gives_the_logits_of_its_stream(name, options):
    """Past chunk boundaries (chunks of 8) and a prefill that ends inside one; float64."""
    network = model(name, **options).double().eval()
    tokens = torch.randint(0, network.config.vocab_size, (3, 30))
    with torch.no_grad():
        _, state = network(tokens[:, :5], state=network.init_state(3, max_length=30), return_state=True)
        static = network.static_state(state, 30)
        for t in range(5, 30):
            logits, state = network(tokens[:, t : t + 1], state=state, return_state=True)
            assert relative_error(network.static_step(tokens[:, t : t + 1], static), logits[:, -1]) < 1e-10


# Transformer-XL streams in segments (a stream's memory moves at each segment end), beside the default one segment
XL_SEGMENTS = [
    ("transformer_xl", {"segment_length": 4, "memory_length": 6}),
    ("fnet_ar_xl", {"segment_length": 3, "memory_length": 7, "window": 8}),
    ("transformer_xl", {"segment_length": 8, "memory_length": 48}),  # a window of the capacity, shorter than M + S
]


@pytest.mark.parametrize(("name", "options"), [("transformer_xl", {}), *XL_SEGMENTS])
def test_a_transformer_xl_window_follows_its_moving_memory_with_rows_at_their_own_positions(name, options):
    """Two rows prefilled to different lengths (one mid-segment, one at a segment's end) stepped in one batch of static
    windows, across segment ends where the stream's memory moves: each row's logits are those of its stream alone,
    the windows written in place."""
    network = model(name, **options).double().eval()
    tokens = torch.randint(0, 20, (2, 40))
    with torch.no_grad():
        streams = [
            network(tokens[r : r + 1, :prefill], state=network.init_state(1, max_length=40), return_state=True)[1]
            for r, prefill in ((0, 5), (1, 12))
        ]
        static = type(streams[0]).concat([network.static_state(state, 40) for state in streams])
        pointers = [tensor.data_ptr() for tensor in static.tensors()]
        for k in range(25):
            columns = (5 + k, 12 + k)
            got = network.static_step(torch.tensor([[tokens[r, c]] for r, c in enumerate(columns)]), static)
            for r, c in enumerate(columns):
                logits, streams[r] = network(tokens[r : r + 1, c : c + 1], state=streams[r], return_state=True)
                assert relative_error(got[r], logits[0, -1]) < 1e-10
    assert [tensor.data_ptr() for tensor in static.tensors()] == pointers


@pytest.mark.parametrize(("name", "options"), [(name, {}) for name in LM_MODELS] + XL_SEGMENTS[:2] + [DISTILLED_WINDOW, FNET_AR_ALONE])
def test_a_static_step_is_captured_whole_and_makes_no_tensor_on_the_host(name, options):
    """What a CUDA graph of the step needs, checked on the CPU through ``torch.compile``'s capture: nothing read back
    from the device (a read is a graph break, an error under ``fullgraph``), no tensor made on the host (a copy to
    the device, which a CUDA graph cannot capture) and one capture for every position (a step that read a position
    kept on the host would be recompiled at each: a CUDA graph would replay the first's); the captured step writes
    the buffers as the eager one does."""
    network = model(name, **options).double().eval()
    tokens = torch.randint(0, 20, (2, 12))
    host_made, captures = [], []

    def backend(graph, example_inputs):
        host_made.extend(host_made_tensors(graph))
        captures.append(graph)
        return graph.forward

    torch._dynamo.reset()
    with torch.no_grad():
        _, state = network(tokens[:, :5], state=network.init_state(2, max_length=16), return_state=True)
        eager, captured = network.static_state(state, 16), network.static_state(state, 16)
        step = torch.compile(network.static_step, fullgraph=True, backend=backend)
        for t in range(5, 12):
            assert relative_error(step(tokens[:, t : t + 1], captured), network.static_step(tokens[:, t : t + 1], eager)) < 1e-12
    assert not host_made, host_made
    assert len(captures) == 1


@pytest.mark.parametrize(("name", "options"), [(name, {}) for name in LM_MODELS] + XL_SEGMENTS[:2] + [DISTILLED_WINDOW, FNET_AR_ALONE])
def test_a_static_step_after_the_eager_step_of_one_row_runs_no_fft(name, options):
    """``StepGraph`` captures a batch's step after an eager step of one row's copy, which fills the operators the
    parts cache; an FFT in the captured step would make its cuFFT plan (one per shape: the batch's is new) inside the
    capture, which fails."""
    network = model(name, **options).double().eval()
    tokens = torch.randint(0, 20, (3, 8))
    with torch.no_grad():
        _, state = network(tokens[:, :5], state=network.init_state(3, max_length=16), return_state=True)
        static = network.static_state(state, 16)
        network.static_step(tokens[:1, 5:6], static.select([0]))
        with OperatorsCalled() as called:
            network.static_step(tokens[:, 5:6], static)
    assert called.operators and not [name for name in called.operators if "fft" in name]


@pytest.mark.parametrize("name", [name for name in LM_MODELS if model(name).static_decoding])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_generate_from_static_buffers_gives_the_tokens_of_the_stream(name, temperature):
    """Prompts of different lengths (rows read their prompts, then end, at different steps) and a stop token (the first
    the second row makes: it ends that row at once)."""
    network = model(name).double().eval()
    prompts = [torch.randint(0, 20, (length,)) for length in (2, 9, 5)]
    options = {"temperature": temperature, "seed": 3}
    options["stop"] = [int(generate(network, prompts, 1, **options)[1][0])]
    stream = generate(network, prompts, 24, decoding="stream", **options)
    static = generate(network, prompts, 24, decoding="static", **options)
    assert [ids.tolist() for ids in static] == [ids.tolist() for ids in stream]
    assert len(stream[1]) == 1


def test_static_decoding_is_chosen_and_refused_with_the_reason():
    tnn, relative = model("tnn"), model("tnn", mixer="relative_attention")  # outside a Transformer-XL block: a stream only
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert not use_static_decoding(tnn, "auto", cpu) and use_static_decoding(tnn, "auto", cuda)
    assert use_static_decoding(tnn, "static", cpu) and not use_static_decoding(tnn, "stream", cuda)
    assert not use_static_decoding(relative, "auto", cuda)
    with pytest.raises(ValueError, match="does not decode from static buffers.*use decoding='stream'"):
        generate(relative, [torch.tensor([1, 2])], 3, decoding="static")
    with pytest.raises(ValueError, match="does not decode from static buffers"):
        relative.static_state(relative.init_state(1, max_length=8), 8)
    with pytest.raises(ValueError, match=r"decoding must be one of \['auto', 'static', 'stream'\], got 'graphs'"):
        generate(tnn, [torch.tensor([1, 2])], 3, decoding="graphs")


def test_a_static_decoder_steps_up_to_its_capacity_and_needs_cuda_for_graphs():
    network = model("tnn").eval()
    with torch.no_grad():
        _, state = network(torch.tensor([[1, 2, 3]] * 3), state=network.init_state(3, max_length=5), return_state=True)
        with pytest.raises(ValueError, match="CUDA graphs need a model on a CUDA device, got cpu"):
            StaticDecoder(network, state, 5, graph=True)
        with pytest.raises(ValueError, match="capacity must be an integer >= 4, got 3"):  # room for one more token at least
            network.static_state(state, 3)
        decoder = StaticDecoder(network, state, 5)
        for tokens in ([4, 5, 6], [7, 8, 9]):
            assert decoder.step(torch.tensor(tokens)).shape == (3, network.config.vocab_size)
        with pytest.raises(ValueError, match="the streams have reached the capacity their static buffers were made for"):
            decoder.step(torch.tensor([1, 1, 1]))
        with pytest.raises(ValueError, match=r"tokens must be \(batch, 1\) token ids, one per row, got shape \(3, 2\)"):
            network.static_step(torch.tensor([[1, 2]] * 3), decoder.state)
