import pytest
import torch

import tokenmix
from tokenmix.models import ModelConfig


def tiny(task="lm", **options):
    classes = 3 if task == "classify" else None
    return tokenmix.build_model("tnn", task=task, vocab_size=50, dim=16, depth=2, num_classes=classes, rpe_dim=8, **options)


def test_encoder_is_bidirectional():
    model = tiny("mlm")
    tokens = torch.randint(0, 50, (1, 20))
    changed = tokens.clone()
    changed[0, 15] = (changed[0, 15] + 1) % 50
    assert not torch.allclose(model(tokens)[0, 5], model(changed)[0, 5])


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
        ({"bogus": 1}, "unknown option 'bogus' for model 'tnn'"),
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


@pytest.mark.parametrize("name", tokenmix.list_models())
def test_a_seed_draws_the_initial_weights_an_earlier_release_drew(name):
    """Seed 0 builds the weights ``tests/saved_models.py`` saved: reordering how a model builds its
    parts would change every result the docs quote for a seed, with no error anywhere."""
    from safetensors.torch import load_file
    from saved_models import FOLDER, build

    torch.manual_seed(0)
    drawn = build(name).state_dict()
    saved = load_file(str(FOLDER / name / "model.safetensors"))
    assert drawn.keys() == saved.keys()
    for key, weight in saved.items():
        assert torch.equal(drawn[key], weight), f"{name}: {key} drawn differently from seed 0"


@pytest.mark.parametrize("name", tokenmix.list_models())
def test_a_model_saved_by_an_earlier_release_loads_as_the_same_model(name):
    """``tests/saved_models.py`` wrote one of each model; its config and weights still load and give its logits."""
    from safetensors.torch import load_file
    from saved_models import FOLDER, TOKENS

    assert (FOLDER / name).is_dir(), f"no saved {name}: run python tests/saved_models.py"
    model = tokenmix.open_run(FOLDER / name).model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), load_file(str(FOLDER / name / "logits.safetensors"))["logits"], rtol=1e-5, atol=1e-6)
