import pytest
import torch
from conftest import assert_causal_gradient

import tokenmix
from tokenmix.models import ModelConfig


def tiny(task="lm", **options):
    classes = 3 if task == "classify" else None
    return tokenmix.build_model("tnn", task=task, vocab_size=50, dim=16, depth=2, num_classes=classes, rpe_dim=8, **options)


@pytest.mark.parametrize("task, shape", [("lm", (2, 13, 50)), ("mlm", (2, 13, 50)), ("classify", (2, 3))])
def test_output_shapes(task, shape):
    assert tiny(task)(torch.randint(0, 50, (2, 13))).shape == shape


def test_whole_lm_is_causal_through_gradients():
    model = tiny("lm").double()
    tokens = torch.randint(0, 50, (2, 40))
    embeddings = model.embedding(tokens).detach().requires_grad_(True)
    model.embedding.forward = lambda _tokens: embeddings  # differentiate w.r.t. the embedded inputs
    logits = model(tokens)
    (grad,) = torch.autograd.grad(logits[:, 17].sum(), embeddings)
    assert_causal_gradient(grad, 17)


def test_encoder_is_bidirectional():
    model = tiny("mlm")
    tokens = torch.randint(0, 50, (1, 20))
    changed = tokens.clone()
    changed[0, 15] = (changed[0, 15] + 1) % 50
    assert not torch.allclose(model(tokens)[0, 5], model(changed)[0, 5])


@pytest.mark.parametrize("task", ["lm", "mlm", "classify"])
def test_padded_tokens_change_nothing_real(task):
    model = tiny(task).eval()
    tokens = torch.randint(0, 50, (2, 25))
    mask = torch.ones(2, 25, dtype=torch.bool)
    mask[0, 18:] = False
    other = tokens.clone()
    other[~mask] = torch.randint(0, 50, (int((~mask).sum()),))
    a, b = model(tokens, mask), model(other, mask)
    if task == "classify":
        torch.testing.assert_close(a, b)
    else:
        torch.testing.assert_close(a[mask], b[mask])


def test_classifier_on_padded_batch_equals_each_sequence_alone():
    model = tiny("classify").eval()
    lengths = [7, 19, 12]
    sequences = [torch.randint(0, 50, (n,)) for n in lengths]
    batch = torch.zeros(3, max(lengths), dtype=torch.long)
    mask = torch.zeros(3, max(lengths), dtype=torch.bool)
    for row, sequence in enumerate(sequences):
        batch[row, : len(sequence)] = sequence
        mask[row, : len(sequence)] = True
    together = model(batch, mask)
    for row, sequence in enumerate(sequences):
        torch.testing.assert_close(together[row], model(sequence[None])[0], rtol=1e-5, atol=1e-5)


def test_save_and_load_round_trip(tmp_path):
    model = tiny("lm", decay=0.95)
    model.save_pretrained(tmp_path / "saved")
    loaded = tokenmix.from_pretrained(tmp_path / "saved")
    assert loaded.config == model.config
    tokens = torch.randint(0, 50, (2, 11))
    torch.testing.assert_close(loaded(tokens), model(tokens))
    assert loaded.embedding.weight.data_ptr() != 0
    with pytest.raises(ValueError, match="config.json"):
        tokenmix.from_pretrained(tmp_path / "missing")


def test_config_json_round_trip():
    config = ModelConfig("tnn", "classify", 10, 8, 1, 4, {"decay": 1.0})
    assert ModelConfig.from_dict(__import__("json").loads(config.to_json())) == config


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"name": "nope"}, "name must be one of"),
        ({"task": "translate"}, "task must be one of"),
        ({"vocab_size": 0}, "vocab_size"),
        ({"dim": -1}, "dim"),
        ({"task": "classify"}, "num_classes"),
        ({"num_classes": 3}, "num_classes"),
        ({"bogus": 1}, "bogus"),
        ({"expand": 0}, "expand"),
    ],
)
def test_bad_model_arguments_raise(kwargs, message):
    arguments = {"name": "tnn", "vocab_size": 10, "dim": 8, "depth": 1, **kwargs}
    with pytest.raises(ValueError, match=message):
        tokenmix.build_model(arguments.pop("name"), **arguments)


@pytest.mark.parametrize(
    "tokens, message",
    [
        (torch.randint(0, 50, (5,)), "batch, length"),
        (torch.randn(1, 5), "integer"),
        (torch.full((1, 5), 50), r"\[0, vocab_size=50\)"),
        (torch.full((1, 5), -1), "vocab_size"),
    ],
)
def test_bad_tokens_raise(tokens, message):
    with pytest.raises(ValueError, match=message):
        tiny()(tokens)
