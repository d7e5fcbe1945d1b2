"""The same numbers on CUDA as on CPU, over the registries: every mixer and model (forward and gradients),
streaming and generation, streaming states, training through the CLI, and the serve engine.

The device is ``TOKENMIX_TEST_DEVICE`` (default "cuda"; the module is skipped where torch sees no GPU).
Mixers and models are compared in float64, where the two devices' kernels differ by round-off alone, far
below the 1e-9 asked; a float32 step inside a float64 module (CPU and CUDA float32 exp and sin differ
in the last bit) shows as about 1e-8. ``TOKENMIX_TEST_DEVICE=cpu`` runs the module here, CPU against
CPU: that shows the tests run, not that the devices agree.
"""

import copy
import os

import pytest
import torch
import torch.nn.functional as F
from conftest import LENGTHS, TINY_RUN, random_chunks, relative_error
from test_contracts import LM_MODELS, MODEL_TASKS, MODES, mixer, model, padded_pair
from test_runs import steps_logged
from test_train import tiny_config

import tokenmix
from tokenmix.cli import main
from tokenmix.models.distil import distillable, distilled_model, fit_orders
from tokenmix.runs import open_run
from tokenmix.runs.checkpoint import load_checkpoint
from tokenmix.train import Trainer

DEVICE = torch.device(os.environ.get("TOKENMIX_TEST_DEVICE", "cuda"))
pytestmark = pytest.mark.skipif(
    DEVICE.type == "cuda" and not torch.cuda.is_available(),
    reason="needs a CUDA device (TOKENMIX_TEST_DEVICE=cpu runs it here against itself)",
)
TOLERANCE = 1e-9  # float64 on two devices: round-off of FFTs and reductions done in another order


def assert_same(got: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    """Tensors computed on DEVICE equal their CPU counterparts up to TOLERANCE (relative, each tensor)."""
    assert len(got) == len(expected)
    for index, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert a.device.type == DEVICE.type and a.shape == b.shape, index
        assert relative_error(a.cpu(), b) < TOLERANCE, (index, relative_error(a.cpu(), b))


def gradients(output: torch.Tensor, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """d output / d inputs; zeros for an input the output does not use (a parameter idle at length 1)."""
    return list(torch.autograd.grad(output, inputs, allow_unused=True, materialize_grads=True))


def on_device(module: torch.nn.Module) -> torch.nn.Module:
    return copy.deepcopy(module).to(DEVICE)


def tensors_of(state) -> list[torch.Tensor]:
    """Every tensor a streaming state holds, in a fixed order (read from its plain form)."""

    def walk(value):
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (dict, list)):
            for item in value.values() if isinstance(value, dict) else value:
                yield from walk(item)

    return list(walk(state.to_plain()))


DISTILLABLE = [name for name in LM_MODELS if any(distillable(module) for module in model(name).modules())]


# --- mixers --------------------------------------------------------------------------------------


def mixer_results(layer, x: torch.Tensor, mask: torch.Tensor, upstream: torch.Tensor) -> list[torch.Tensor]:
    """The output, and the gradients of <output, upstream> toward x and every parameter."""
    x = x.clone().requires_grad_()
    y = layer(x, mask)
    return [y, *gradients((y * upstream).sum(), [x, *layer.parameters()])]


@pytest.mark.parametrize(("name", "causal"), MODES)
@pytest.mark.parametrize("n", LENGTHS)
def test_a_mixer_gives_its_cpu_output_and_gradients_on_the_device(name, causal, n):
    layer = mixer(name, causal).double()
    x = torch.randn(2, n, layer.dim, dtype=torch.float64)
    upstream = torch.randn_like(x)
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[1, n // 2 :] = False  # row 1 ends with padding
    expected = mixer_results(layer, x, mask, upstream)
    assert_same(mixer_results(on_device(layer), x.to(DEVICE), mask.to(DEVICE), upstream.to(DEVICE)), expected)


# --- models --------------------------------------------------------------------------------------


def model_results(net, tokens: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> list[torch.Tensor]:
    """The output, the cross-entropy loss (each real token predicting itself; a classifier its label)
    and its gradients toward every parameter."""
    out = net(tokens, mask)
    loss = F.cross_entropy(out, labels) if out.dim() == 2 else F.cross_entropy(out[mask], tokens[mask])
    return [out, loss, *gradients(loss, list(net.parameters()))]


@pytest.mark.parametrize(("name", "task"), MODEL_TASKS)
def test_a_model_gives_its_cpu_output_loss_and_gradients_on_the_device(name, task):
    net = model(name, task).double().eval()  # eval: no dropout draws, which differ between devices
    tokens, _, mask = padded_pair((2, 33), lambda: torch.randint(0, 20, (2, 33)))
    labels = torch.tensor([2, 0])
    expected = model_results(net, tokens, mask, labels)
    assert_same(model_results(on_device(net), tokens.to(DEVICE), mask.to(DEVICE), labels.to(DEVICE)), expected)


@pytest.mark.parametrize("name", LM_MODELS)
def test_streaming_on_the_device_equals_the_forward_there(name):
    net = on_device(model(name).double().eval())
    tokens, _, mask = (t.to(DEVICE) for t in padded_pair((2, 100), lambda: torch.randint(0, 20, (2, 100))))
    pieces = []
    with torch.no_grad():
        state = net.init_state(2, max_length=100, device=DEVICE)
        for chunk in random_chunks(100, seed=4):
            logits, state = net(tokens[:, chunk], mask[:, chunk], state=state, return_state=True)
            pieces.append(logits)
        whole = net(tokens, mask)
    assert all(tensor.device.type == DEVICE.type for tensor in tensors_of(state))
    assert relative_error(torch.cat(pieces, dim=1), whole) < 1e-10


@pytest.mark.parametrize("name", LM_MODELS)
def test_generation_on_the_device_gives_the_tokens_it_gives_on_cpu(name):
    """Greedy, and sampled with a seed: each row draws from its own CPU generator (``row_generator``) over
    probabilities brought to the CPU (``choose_tokens``), so the draws are the device's only through
    the probabilities, which differ by float32 round-off; a draw would change only if it fell within
    that of a boundary between two tokens."""
    net = model(name).double()
    prompts = [torch.randint(0, 20, (size,)) for size in (3, 11, 1)]
    decodings = ["stream"] + (["static"] if net.static_decoding else [])  # static on CUDA: a CUDA graph's replays
    for options in ({"temperature": 0}, {"temperature": 1.0, "top_k": 12, "top_p": 0.95, "seed": 5}):
        expected = tokenmix.generate(net, prompts, 30, **options)
        for decoding in decodings:
            got = tokenmix.generate(on_device(net), [prompt.to(DEVICE) for prompt in prompts], 30, decoding=decoding, **options)
            assert [t.tolist() for t in got] == [t.tolist() for t in expected], (options, decoding)


@pytest.mark.skipif(DEVICE.type != "cuda", reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize(
    ("name", "options"),
    [(name, {}) for name in LM_MODELS]
    + [
        ("transformer_xl", {"segment_length": 4, "memory_length": 6}),
        ("fnet_ar_xl", {"segment_length": 3, "memory_length": 7, "window": 8}),
        ("tnn", {"mixer": {"name": "ssm", "order": 4, "window": 2}}),  # a distilled model: its window's taps in the graph
        ("tnn", {"mixer": {"name": "fnet_ar", "window": 4}}),  # FNetAR outside a Transformer-XL block
    ],
)
@pytest.mark.parametrize("rows", [1, 3])
def test_a_cuda_graph_of_the_static_step_replays_the_eager_static_step(name, options, rows):
    """Positions past chunk boundaries (chunks of 8) and segment ends (Transformer-XL memory); between the replays, a
    longer stream and a forward with gradients (which replace or drop the operators the mixers cache for their streams:
    the graph's own must stay)."""
    net = on_device(model(name, **options).double().eval())
    tokens = torch.randint(0, 20, (rows, 40), device=DEVICE)
    with torch.no_grad():
        _, state = net(tokens[:, :5], state=net.init_state(rows, max_length=40), return_state=True)
        graph, eager = (tokenmix.generation.StaticDecoder(net, state, 40, graph=graph) for graph in (True, False))
        for t in range(5, 40):
            assert relative_error(graph.step(tokens[:, t]), eager.step(tokens[:, t])) < 1e-12, t
            if t % 10 == 0:
                net(torch.randint(0, 20, (1, 300), device=DEVICE), state=net.init_state(1, max_length=600), return_state=True)
                with torch.enable_grad():
                    net(tokens).sum().backward()


@pytest.mark.skipif(DEVICE.type != "cuda", reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("name", ["tnn", "transformer_xl"])
def test_cuda_graphs_sharing_a_memory_pool_replay_in_any_order(name):
    """The server's cohorts: graphs of different batches captured on one pool (a later one's logits may lie where an
    earlier one keeps temporaries), replayed in turn and in either order, each equal to its eager static step."""
    from tokenmix.generation.graphs import StepGraph

    net, pool = on_device(model(name).double().eval()), torch.cuda.graph_pool_handle()
    tokens = torch.randint(0, 20, (5, 30), device=DEVICE)
    with torch.no_grad():
        _, state = net(tokens[:, :4], state=net.init_state(5, max_length=30), return_state=True)
        batches = [[0], [1, 2, 3, 4]]
        graphs = [StepGraph(net, net.static_state(state.select(rows), 30), pool) for rows in batches]
        eager = [net.static_state(state.select(rows), 30) for rows in batches]
        for t in range(4, 30):
            got = {index: graphs[index].step(tokens[batches[index], t]) for index in ((0, 1) if t % 2 else (1, 0))}
            for index, rows in enumerate(batches):  # both replayed first: the later one may overwrite the other's output
                assert relative_error(got[index], net.static_step(tokens[rows, t : t + 1], eager[index])) < 1e-12, (t, index)


@pytest.mark.parametrize("name", DISTILLABLE)
def test_distilling_on_the_device_fits_the_modes_it_fits_on_cpu(name):
    """``distil`` reads each Toeplitz mixer's taps where the model is and fits them on the CPU; the
    distilled model then runs there."""
    net = model(name).double().eval()
    device_net = on_device(net)
    fits = {where: fit_orders(candidate, [3], horizon=64)[3] for where, candidate in (("cpu", net), ("device", device_net))}
    for expected, got in zip(fits["cpu"], fits["device"], strict=True):
        assert_same([value.to(DEVICE) for value in got.modes.values()], list(expected.modes.values()))
    tokens = torch.randint(0, 20, (2, 40))
    with torch.no_grad():
        expected = distilled_model(net, 3, 0, fits["cpu"])(tokens)
        got = distilled_model(device_net, 3, 0, fits["device"])(tokens.to(DEVICE))
    assert_same([got], [expected])


@pytest.mark.parametrize("name", LM_MODELS)
def test_a_state_moves_to_the_device_and_back_and_its_rows_are_selected_joined_and_assigned_there(name):
    net = model(name).double().eval()
    device_net = on_device(net)
    tokens = torch.randint(0, 20, (3, 12))
    with torch.no_grad():
        _, state = net(tokens[:, :10], state=net.init_state(3, max_length=12), return_state=True)
        moved = state.to(DEVICE)
        assert all(tensor.device.type == DEVICE.type for tensor in tensors_of(moved))
        assert all(map(torch.equal, tensors_of(moved.to("cpu")), tensors_of(state)))

        def continues(rows: list[int], rows_state) -> None:
            """The rows' last tokens streamed on DEVICE from ``rows_state`` give their CPU forward's logits."""
            logits, _ = device_net(tokens[rows, 10:].to(DEVICE), state=rows_state, return_state=True)
            assert relative_error(logits.cpu(), net(tokens[rows])[:, 10:]) < TOLERANCE

        continues([2, 0], moved.select(torch.tensor([2, 0], device=DEVICE)))  # streaming advances a state in place: one each
        continues([1, 2, 0], type(moved).concat([moved.select([1]), moved.select([2, 0])]))
        continues([2, 1, 2], moved.select([0, 1, 2]).assign([0], moved.select([2])))


# --- training and serving ------------------------------------------------------------------------


def test_training_on_the_device_resumes_there_and_its_checkpoint_loads_on_cpu(text_file, tmp_path):
    run = tmp_path / "run"
    flags = ["--data", text_file, *TINY_RUN, "-o", "rpe_dim=4", "--device", str(DEVICE), "--out", str(run)]
    assert main(["train", *flags, "--steps", "2", "--sample-tokens", "8"]) == 0  # the sample: generation through the CLI
    assert main(["train", "--resume", "--out", str(run), "--steps", "3", "--device", str(DEVICE)]) == 0
    assert load_checkpoint(run)["step"] == 3 and steps_logged(run) == [1, 2, 3]
    trained = open_run(run).model
    saved = tokenmix.open_run(run / "model").model
    tokens = torch.randint(0, trained.config.vocab_size, (2, 16))
    with torch.no_grad():
        logits = trained(tokens)
        torch.testing.assert_close(saved.eval()(tokens), logits, rtol=0, atol=0)
        assert relative_error(on_device(trained)(tokens.to(DEVICE)).cpu(), logits) < 1e-5  # float32


def test_an_interrupted_run_resumed_on_the_device_ends_as_one_never_interrupted(text_file, tmp_path):
    """With dropout drawn on the device: each step seeds every device's generator (``torch.manual_seed``
    of the step's seed), so the resumed steps draw what the uninterrupted ones drew."""
    straight = Trainer(tiny_config(text_file, tmp_path / "a", device=str(DEVICE)), progress=False)
    straight.run()
    interrupted = Trainer(tiny_config(text_file, tmp_path / "b", device=str(DEVICE)), progress=False)
    for _ in range(3):
        interrupted.train_step()
    interrupted.save()
    interrupted.release_lock()  # killed here: the kernel drops its lock
    resumed = Trainer(tiny_config(text_file, tmp_path / "b", device=str(DEVICE)), resume=True, progress=False)
    resumed.run()
    expected, actual = straight.model.state_dict(), resumed.model.state_dict()
    assert expected.keys() == actual.keys() and all(torch.equal(expected[name], actual[name]) for name in expected)


@pytest.fixture
def serving():
    """tests/serve/test_serve_engine.py, for its helpers (needs the serve extra)."""
    pytest.importorskip("prometheus_client", reason='the server needs its extra: pip install "tokenmix[serve]"')
    import test_serve_engine

    return test_serve_engine


@pytest.mark.parametrize("decoding", ["stream", "auto"])  # auto on CUDA: static buffers as a CUDA graph per batch
@pytest.mark.parametrize("name", LM_MODELS)
def test_every_request_the_engine_serves_on_the_device_equals_generate_alone_there(name, decoding, serving):
    from tokenmix.serve.config import EngineConfig
    from tokenmix.serve.engine import Engine
    from tokenmix.serve.jobs import Sampling

    net = on_device(model(name).double().eval())
    config = EngineConfig(context=serving.CONTEXT, max_batch=16, max_state_memory=10**10, chunk=8, prefix_min=0, decoding=decoding)
    engine = Engine(net, serving.TOKEN_BYTES, config)
    jobs = []
    for index, (length, max_tokens) in enumerate([(1, 12), (17, 20), (5, 7), (33, 25), (9, 16), (24, 10)]):
        temperature, top_k = (0.0, 1.0, 0.7)[index % 3], (None, 12)[index % 2]
        sampling = Sampling(max_tokens=max_tokens, temperature=temperature, top_k=top_k, seed=index, n=1 + index % 2)
        jobs.append(serving.submit(engine, torch.randint(0, 20, (length,)).tolist(), sampling))
        if index == 2:
            thread = serving.running(engine)  # the first three are read together; the others join a running batch
    assert all(collected.done.wait(60) and collected.failed is None for _, collected in jobs)
    engine.stop()
    thread.join(5)
    for job, collected in jobs:
        s = job.sampling
        options = {"temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p, "seed": s.seed, "max_length": serving.CONTEXT}
        alone = tokenmix.generate(net, [torch.tensor(job.prompt, device=DEVICE)] * s.n, s.max_tokens, decoding="stream", **options)
        assert [collected.tokens[choice] for choice in range(s.n)] == [tokens.tolist() for tokens in alone]
    assert engine.scheduler.rows == 0 and engine.scheduler.reserved == 0
