import pytest
import torch
from conftest import assert_causal_gradient, random_chunks, relative_error

import tokenmix
from tokenmix.blocks.xl import fourier_layer_indices
from tokenmix.mixers.relative_attention import RelativeAttention, RelativeAttentionOptions, sinusoid_positions
from tokenmix.ops.attention import naive_relative_attention
from tokenmix.train import TrainConfig, Trainer


@pytest.mark.parametrize("memory", [0, 5])
def test_relative_attention_equals_explicit_masked_attention(memory):
    """The mixer's projections around the op, against the op's loop reference (``ops.attention``)."""
    attention = RelativeAttention(8, options=RelativeAttentionOptions(heads=2)).double()
    torch.nn.init.normal_(attention.content_bias)
    torch.nn.init.normal_(attention.position_bias)
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    context = torch.cat([torch.randn(2, memory, 8, dtype=torch.float64), x], dim=1)
    everything = torch.ones(2, context.shape[1], dtype=torch.bool)
    total, heads, width = context.shape[1], attention.heads, attention.head_dim
    q = attention.query(x).view(2, 6, heads, width)
    k, v = attention.key_value(context).view(2, total, 2, heads, width).unbind(2)
    r = attention.position(sinusoid_positions(total, 8).double()).view(total, heads, width)
    expected = naive_relative_attention(q, k, v, r, attention.content_bias, attention.position_bias, everything)
    torch.testing.assert_close(attention.mix_context(x, context, everything, 0), attention.out(expected.reshape(2, 6, 8)))


def xl(name, **options):
    settings = {"memory_length": 64, "heads": 2, **({"window": 8} if name == "fnet_ar_xl" else {}), **options}
    return tokenmix.build_model(name, vocab_size=30, dim=16, depth=4, **settings).double().eval()


@pytest.mark.parametrize("name", ["transformer_xl", "fnet_ar_xl"])
def test_segments_with_memory_equal_one_pass_when_memory_covers_the_stream(name):
    model = xl(name, segment_length=16)
    tokens = torch.randint(0, 30, (2, 40))
    whole = model(tokens)
    pieces, state = [], model.init_state(2)
    for start, stop in [(0, 10), (10, 23), (23, 24), (24, 40)]:
        logits, state = model(tokens[:, start:stop], state=state, return_state=True)
        pieces.append(logits)
    torch.testing.assert_close(torch.cat(pieces, dim=1), whole)
    assert state.position == 40 and all(b.memory.shape[1] == 32 and b.segment.shape[1] == 8 for b in state.blocks)


@pytest.mark.parametrize("name", ["transformer_xl", "fnet_ar_xl"])
def test_xl_language_models_are_causal(name):
    model = xl(name)
    tokens = torch.randint(0, 30, (2, 30))
    embeddings = model.embedding(tokens).detach().requires_grad_(True)
    model.embedding.forward = lambda _tokens: embeddings
    (grad,) = torch.autograd.grad(model(tokens)[:, 12].sum(), embeddings)
    assert_causal_gradient(grad, 12)


def test_memory_is_truncated_and_padding_ignored():
    model = xl("transformer_xl", memory_length=5, segment_length=12)
    tokens = torch.randint(0, 30, (2, 12))
    _, state = model(tokens, state=model.init_state(2), return_state=True)
    assert all(b.memory.shape[1] == 5 and b.segment.shape[1] == 0 for b in state.blocks)
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, 8:] = False
    other = tokens.clone()
    other[1, 8:] = (other[1, 8:] + 1) % 30
    torch.testing.assert_close(model(tokens, mask)[mask], model(other, mask)[mask])


def test_fourier_layer_placement():
    assert fourier_layer_indices(6, 3, "bottom") == {0, 1, 2}
    assert fourier_layer_indices(6, 3, "top") == {3, 4, 5}
    assert fourier_layer_indices(6, 3, "alternating") == {1, 3, 5}
    model = xl("fnet_ar_xl", fourier_layers=1, fourier_placement="bottom")
    kinds = [type(block.mixer).__name__ for block in model.blocks]
    assert kinds == ["FnetAr", "RelativeAttention", "RelativeAttention", "RelativeAttention"]
    assert model.num_parameters() < xl("transformer_xl").num_parameters()


@pytest.mark.parametrize(
    "name, options, message",
    [
        ("transformer_xl", {"heads": 3}, "divisible"),
        ("fnet_ar_xl", {"memory_length": 4}, "memory_length"),
        ("fnet_ar_xl", {"fourier_layers": 5}, "fourier_layers"),
        ("fnet_ar_xl", {"fourier_placement": "middle"}, "fourier_placement"),
        ("transformer_xl", {"task": "mlm"}, "task"),
    ],
)
def test_bad_xl_options(name, options, message):
    with pytest.raises(ValueError, match=message):
        tokenmix.build_model(name, vocab_size=30, dim=16, depth=4, **options)


def test_xl_training_resumes_exactly_with_memory(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_bytes(("Now is the winter of our discontent. " * 300).encode())

    def config(out):
        return TrainConfig(
            model="transformer_xl", data=str(path), dim=16, depth=2, seq_len=16, batch_size=2, steps=6,
            eval_every=3, eval_tokens=256, out=str(out), options={"memory_length": 16, "heads": 2},
        )  # fmt: skip

    straight = Trainer(config(tmp_path / "a"), progress=False)
    straight.run()
    interrupted = Trainer(config(tmp_path / "b"), progress=False)
    for _ in range(3):
        interrupted.train_step()
    assert interrupted.segment_state.position == 48  # three segments of one stream
    interrupted.save()
    interrupted.release_lock()  # killed here: the kernel drops its lock
    resumed = Trainer(config(tmp_path / "b"), resume=True, progress=False)
    memories = [[block.memory for block in trainer.segment_state.blocks] for trainer in (resumed, interrupted)]
    torch.testing.assert_close(*memories)
    resumed.run()
    for name, value in straight.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[name]), name


@pytest.mark.parametrize("name", ["transformer_xl", "fnet_ar_xl"])
def test_segments_stream_in_any_chunks_once_memory_is_truncated(name):
    """Segments of 8 with memory 8 (< the stream): one call per segment, as training reads them, equals any chunking."""
    model = xl(name, memory_length=8, segment_length=8)
    tokens = torch.randint(0, 30, (2, 45))
    with torch.no_grad():
        by_segment, state = [], model.init_state(2)
        for start in range(0, 45, 8):
            logits, state = model(tokens[:, start : start + 8], state=state, return_state=True)
            by_segment.append(logits)
        chunked, state = [], model.init_state(2)
        for chunk in random_chunks(45, seed=4):
            logits, state = model(tokens[:, chunk], state=state, return_state=True)
            chunked.append(logits)
    assert relative_error(torch.cat(chunked, dim=1), torch.cat(by_segment, dim=1)) <= 1e-10
    assert relative_error(torch.cat(by_segment, dim=1)[:, 8:], model(tokens)[:, 8:]) > 1e-6  # memory was truncated: not one segment


def test_a_run_records_its_segment_and_older_configs_get_their_runs():
    """``segment_length`` is a model option: a run records its --seq-len (unless given); a config saved
    before it existed gets the segment its run trained with, and other models none."""
    from tokenmix.models import ModelConfig
    from tokenmix.runs.migrations import with_segment_length

    fields = {"vocab_size": 30}
    assert TrainConfig(model="transformer_xl", seq_len=24).model_config(fields).options["segment_length"] == 24
    assert TrainConfig(model="fnet_ar_xl", seq_len=24, options={"segment_length": 8}).model_config(fields).options["segment_length"] == 8
    assert "segment_length" not in TrainConfig(model="tnn", seq_len=24).model_config(fields).options
    saved = ModelConfig("transformer_xl", "lm", vocab_size=30, dim=16, depth=2).to_dict()
    del saved["options"]["segment_length"]
    assert with_segment_length(ModelConfig.from_dict(saved), saved, 24).options["segment_length"] == 24
    tnn = ModelConfig("tnn", "lm", vocab_size=30, dim=16, depth=2).to_dict()
    assert "segment_length" not in with_segment_length(ModelConfig.from_dict(tnn), tnn, 24).options


def test_evaluation_reads_segments_of_its_length_whatever_segment_the_model_was_built_with():
    """``evaluate_lm`` at length L reads the streams in segments of L, memory carried (as before XL models
    recorded a segment): a model built without one, or with another, gives what one with L gives."""
    from tokenmix.train.evaluate import evaluate_lm

    data = torch.randint(0, 30, (200,))
    built_with = {segment: xl("transformer_xl", memory_length=8, segment_length=segment) for segment in (None, 8, 16)}
    for model in built_with.values():
        model.load_state_dict(built_with[16].state_dict())
    losses = {segment: evaluate_lm(model, data, 16, batch_size=2)["loss"] for segment, model in built_with.items()}
    assert losses[None] == losses[8] == losses[16]
    assert evaluate_lm(built_with[16], data, 8, batch_size=2)["loss"] != losses[16]  # the length is the segment
    copy = built_with[16].with_options(segment_length=8)
    assert copy.config.options["segment_length"] == 8 and built_with[16].config.options["segment_length"] == 16
    tokens = torch.randint(0, 30, (2, 12))
    torch.testing.assert_close(copy(tokens), built_with[16](tokens))
