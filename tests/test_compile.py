"""Compiled mixers and blocks (``tokenmix.compilation``) over the registries: captured whole (``fullgraph``),
forward and backward, with eager's numbers, and without a recompilation per length.

Dynamo's capture decides whether a module compiles whole and how often: the sweeps over lengths run the
captured graphs as they are (backend "eager"), except the first, static one, which runs the forward and
backward that AOTAutograd traces from it (backend "aot_eager": where autocast once leaked into a custom
backward on CUDA), so that one capture serves both.
Inductor's code generation, the default backend, runs once here, through ``tokenmix train --compile``.
"""

import copy
import json

import pytest
import torch
from conftest import LENGTHS, TINY_RUN, host_made_tensors, relative_error
from test_contracts import MODES, SMALL, mixer
from torch._dynamo.backends.registry import lookup_backend
from torch._dynamo.utils import counters

import tokenmix
from tokenmix.bench import Case
from tokenmix.cli import main
from tokenmix.compilation import check_compile_mode, compile_blocks, compile_forward
from tokenmix.mixers import Mixer
from tokenmix.models.registry import list_models, model_spec, resolve_model
from tokenmix.runs.checkpoint import load_checkpoint

# Three lengths compiled twice: the first's static graph (one of LENGTHS, so that the sweep over them reuses it),
# then one symbolic graph, reused by the third. The symbolic two share a power-of-two FFT size with 1000 and 1024
# (2048), and neither is a multiple of a TCN's dilation or a chunk; an operator defined on the length's own FFT
# grid (fd_tno) or on a 2-D grid gets two that share one with them (2048, width 32).
SHARED_LENGTHS = (100, 521, 601)
ONE_GRID_LENGTHS = (100, 1001, 1010)
TOLERANCE = 1e-5
# A block's mixers as small as the mixers' own cases (fewer layers to trace), its chunks shorter than the lengths;
# ``resolve_model`` drops a fallback where the model has no option of its name.
SMALL_BLOCKS = {key: value for options in SMALL.values() for key, value in options.items()} | {"chunk_size": 8}


def first_block(name: str, causal: bool) -> torch.nn.Module:
    options = resolve_model(name, {}, dim=16, depth=1, fallbacks=SMALL_BLOCKS)
    return model_spec(name).layers(16, causal, 1, options)[0]


def one_model_per_block_kind() -> list[tuple[str, bool]]:
    """(model, causal) for the first model of each kind of block (its class, over a sequence or a grid) in each
    mode: the models that share a block differ in the mixer inside it, and each mixer is compiled on its own."""
    kept = {}
    for name in list_models():
        for causal in (True, False):
            if ("lm" if causal else "mlm") in model_spec(name).tasks:
                block = first_block(name, causal)
                axes = max(part.token_axes for part in block.modules() if isinstance(part, Mixer))
                kept.setdefault((type(block), axes, causal), (name, causal))
    return list(kept.values())


BLOCKS = one_model_per_block_kind()


def results(module, x: torch.Tensor, mask: torch.Tensor, upstream: torch.Tensor) -> list[torch.Tensor]:
    """The output and the gradients of <output, upstream> toward x and every parameter."""
    x = x.clone().requires_grad_()
    y = module(x, mask)
    return [y, *torch.autograd.grad((y * upstream).sum(), [x, *module.parameters()], allow_unused=True, materialize_grads=True)]


def inputs(n: int, dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, mask with a third of row 1 padded, upstream gradient)."""
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[1, : n // 3] = False
    return torch.randn(2, n, dim), mask, torch.randn(2, n, dim)


def assert_same(compiled, module, n: int, dim: int) -> None:
    x, mask, upstream = inputs(n, dim)
    for got, expected in zip(results(compiled, x, mask, upstream), results(module, x, mask, upstream), strict=True):
        assert relative_error(got, expected) < TOLERANCE, (n, relative_error(got, expected))


def shared_lengths(module: torch.nn.Module) -> tuple[int, ...]:
    on_a_grid = any(
        isinstance(part, Mixer) and (part.token_axes == 2 or getattr(part, "taps_depend_on_length", False)) for part in module.modules()
    )
    return ONE_GRID_LENGTHS if on_a_grid else SHARED_LENGTHS


def shared_function_outputs(graph: torch.fx.GraphModule, example_inputs) -> list[list[str]]:
    """For each custom autograd Function captured in ``graph`` whose forward returns a tensor that another of its
    operations also returned (``.to`` its own dtype, a write in place): the names of those operations. torch 2.11's
    compiler routes the gradient of such an output to the wrong slot (pytorch issue 180642: the gradients were
    zeros); found by running the graph on its example inputs and each Function's forward body beside it."""
    found = []

    class Body(torch.fx.Interpreter):
        def run_node(self, node):
            value = super().run_node(node)
            if isinstance(value, torch.Tensor):
                self.kept.append(value)  # alive until the check: no id reused
                self.producers.setdefault(id(value), []).append(node.name)
            return value

    class Parent(torch.fx.Interpreter):
        def run_node(self, node):
            if node.op == "call_function" and node.target is torch.ops.higher_order.autograd_function_apply:
                body = Body(getattr(self.module, node.args[0].target))
                body.producers, body.kept = {}, []
                outputs = body.run(*[self.env[arg] for arg in node.args[2:]])[0]
                output = outputs[0] if isinstance(outputs, tuple) else outputs
                if len(body.producers[id(output)]) > 1:
                    found.append(body.producers[id(output)])
            return super().run_node(node)

    with torch.no_grad():
        Parent(graph).run(*example_inputs)
    return found


def first_graph_through_aot_autograd(faults: list):
    """A backend: the first graph captured runs as AOTAutograd traces its forward and backward ("aot_eager"), the
    later ones as captured ("eager"); where each makes a tensor on the host, or a Function in the first returns a
    shared tensor, goes to ``faults``."""
    graphs = []

    def backend(graph: torch.fx.GraphModule, example_inputs):
        graphs.append(graph)
        faults.extend(host_made_tensors(graph))
        if len(graphs) > 1:
            return graph.forward
        faults.extend(shared_function_outputs(graph, example_inputs))  # run on the static graph's concrete inputs
        return lookup_backend("aot_eager")(graph, example_inputs)

    return backend


def check_compiled(module: torch.nn.Module, dim: int, lengths: tuple[int, ...] = ()) -> None:
    """``module`` compiled gives its eager output and gradients at three shared lengths, compiling twice over
    them (the first length's shape, its backward traced by AOTAutograd, then one graph with the length
    symbolic), and at ``lengths``; its graphs make no tensor on the host (``host_made_tensors``) and their
    Functions return tensors of their own (``shared_function_outputs``)."""
    torch._dynamo.reset()
    counters.clear()
    faults = []
    compiled = compile_forward(copy.deepcopy(module), backend=first_graph_through_aot_autograd(faults))
    shared = shared_lengths(module)
    for index, n in enumerate(shared + tuple(n for n in lengths if n not in shared)):
        assert_same(compiled, module, n, dim)
        if index == len(shared) - 1:
            assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])
    assert counters["aot_autograd"]["ok"] == 1, dict(counters["aot_autograd"])
    assert not faults, faults


@pytest.mark.slow
@pytest.mark.parametrize(("name", "causal"), MODES)
def test_a_mixer_compiles_whole_with_its_eager_numbers_and_once_for_many_lengths(name, causal):
    layer = mixer(name, causal)
    check_compiled(layer, layer.dim, LENGTHS)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "causal"), BLOCKS)
def test_a_block_compiles_whole_with_its_eager_numbers_and_once_for_many_lengths(name, causal):
    """One model per kind of block (``one_model_per_block_kind``), at the shared lengths (the mixers inside were
    compared at ``LENGTHS`` too; around them a block works token by token)."""
    check_compiled(first_block(name, causal), 16)


def test_every_block_of_a_model_shares_one_graph():
    network = tokenmix.build_model("tnn", vocab_size=20, dim=16, depth=3)
    torch._dynamo.reset()
    counters.clear()
    compile_blocks(network, backend="aot_eager")
    network(torch.randint(0, 20, (2, 30))).sum().backward()
    assert counters["stats"]["unique_graphs"] == 1


def test_a_compile_mode_is_one_of_torch_compiles():
    assert check_compile_mode("reduce-overhead") == "reduce-overhead"
    with pytest.raises(ValueError, match=r"compile mode must be one of \['default', 'reduce-overhead'"):
        check_compile_mode("fast")
    with pytest.raises(ValueError, match="compile applies to the kinds"):
        Case("generate", "tnn", True, 8, 8, 1, compile=True)


def test_training_compiled_in_bf16_saves_the_weights_under_their_own_names(text_file, tmp_path):
    """The default backend (Inductor) end to end: ``tokenmix train --compile --precision bf16``, then eval."""
    out = tmp_path / "run"
    arguments = ["train", "--data", text_file, *TINY_RUN, "--steps", "3", "--compile", "--precision", "bf16", "--out", str(out)]
    assert main([*arguments, "--device", "cpu"]) == 0
    saved = load_checkpoint(out / "checkpoint.pt")
    assert saved["train_config"]["compile"] and saved["train_config"]["precision"] == "bf16"
    assert not any("_orig_mod" in key for key in saved["model"])
    final = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"final"' in line][-1]
    assert final["bpb"] > 0
    assert main(["eval", str(out), "--precision", "bf16"]) == 0
