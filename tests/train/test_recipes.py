"""Every recipe is a run this library can start; command-line values override a recipe's."""

import pytest
import torch

from tokenmix.cli import main
from tokenmix.cli.recipes import recipe_flags
from tokenmix.cli.train import train_config_from_args
from tokenmix.data.examples import ClassificationData, Examples
from tokenmix.data.sources import source_kind
from tokenmix.models.model import SequenceModel
from tokenmix.train.config import TrainConfig
from tokenmix.train.objectives import objective_for
from tokenmix.train.recipes import apply_recipe, list_recipes, recipe

# The shape of each kind of data (vocabulary, classes, documents per example, image grid), as its loader gives it.
DATA_SHAPES = {
    "listops": (15, 10, 1, None),
    "lra-text": (256, 2, 1, None),
    "lra-retrieval": (256, 2, 2, None),
    "lra-image": (256, 10, 1, (32, 32)),
    "lra-pathfinder": (256, 2, 1, "resolution"),
    "pathfinder-gen": (256, 2, 1, "resolution"),
    "shapes": (256, 4, 1, (16, 16)),
}


def data_fields(source: str, tokenizer: str = "bytes") -> dict:
    """What a run on ``source`` gives its model: a text corpus its tokenizer's vocabulary, classification
    data the classification objective's fields for data of that shape."""
    if source_kind(source) == "corpus":
        return {"vocab_size": int(tokenizer.removeprefix("bpe:")) if tokenizer.startswith("bpe:") else 256}
    vocab, classes, documents, grid = DATA_SHAPES[source.split(":")[0]]
    if grid == "resolution":
        resolution = int(source.split("resolution=")[1].split(":")[0]) if "resolution=" in source else 32  # the sources' default
        grid = (resolution, resolution)
    examples = Examples.from_sequences([[0]] * documents * 2, [0, 1], documents=documents)
    data = ClassificationData(source, vocab, classes, examples, examples, examples, grid)
    return objective_for(data, "classify").model_fields()


def find_option(tree: dict, name: str) -> list:
    """The values of every option called ``name`` in ``tree``, at any depth (the owner's first); a part's
    value is its mixer's name."""
    found = [tree[name]["name"] if isinstance(tree[name], dict) else tree[name]] if name in tree else []
    for value in tree.values():
        if isinstance(value, dict):
            found += find_option(value, name)
    return found


@pytest.mark.parametrize("name", list_recipes())
def test_every_recipe_resolves_to_a_model(name):
    settings = recipe(name).settings
    given = {"data": settings["data"].replace("DIR", "/data")} if "DIR" in settings.get("data", "") else {}
    config = TrainConfig(**apply_recipe(name, given))
    model_config = config.model_config(data_fields(config.data, config.tokenizer))  # every option checked and resolved
    assert config.recipe == name and model_config.name == settings["model"]
    for key, value in settings.get("options", {}).items():
        found = find_option(model_config.options.as_dict(), key)
        assert found and all(setting == value for setting in found), key
    for grid in find_option(model_config.options.as_dict(), "grid"):
        assert tuple(grid) == data_fields(config.data)["grid"]
    assert recipe(name).source and recipe(name).description
    with torch.device("meta"):  # the full-size model is built (every constructor's checks run) without memory
        assert SequenceModel(model_config).num_parameters() > 0


def test_recipes_that_read_files_ask_for_them():
    with pytest.raises(ValueError, match="give --data lra-text:/path/to/the/release:max_length=4096"):
        apply_recipe("lra-text-tnn", {})
    with pytest.raises(ValueError, match="recipe must be one of"):
        apply_recipe("lra-nope", {})


def test_flags_override_a_recipe_and_options_add_to_its_own(tmp_path):
    from tokenmix.cli import build_parser

    argv = ["train", "--recipe", "lra-listops-tnn", "--lr", "0.01", "-o", "rpe_layers=1", "--out", str(tmp_path / "r")]
    config = train_config_from_args(build_parser().parse_args(argv))
    assert config.lr == 0.01 and config.batch_size == 128 and config.recipe == "lra-listops-tnn"
    assert config.options == {**recipe("lra-listops-tnn").settings["options"], "rpe_layers": 1}


def test_recipe_flags_read_back_as_the_same_settings():
    from tokenmix.cli import build_parser

    settings = recipe("lra-text-mega").settings
    argv = ["train", *" ".join(recipe_flags(settings)).replace("lra-text:DIR", "lra-text:/data").split()]
    config = train_config_from_args(build_parser().parse_args(argv))
    expected = TrainConfig(**{**settings, "data": settings["data"].replace("DIR", "/data")})
    assert config == expected


def test_recipes_command_lists_and_shows(capsys):
    assert main(["recipes"]) == 0
    listing = capsys.readouterr().out
    assert all(name in listing for name in list_recipes())
    assert main(["recipes", "lra-image-tnn"]) == 0
    shown = capsys.readouterr().out
    assert "OpenNLPLab/lra" in shown and "-o axis_mixer=tno" in shown


def test_a_recipes_warmup_follows_a_shorter_run_and_says_so():
    notes = []
    settings = apply_recipe("lra-listops-tnn", {"steps": 300}, notes)
    assert settings["warmup"] == 10 and settings["steps"] == 300  # 1000 of 30000 steps
    assert notes == ["recipe lra-listops-tnn: warmup 1000 of its 30000 steps scaled to 10 of --steps 300 (give --warmup to set it)"]
    assert apply_recipe("lra-listops-tnn", {"steps": 300, "warmup": 20})["warmup"] == 20
    with pytest.raises(ValueError, match=r"warmup \(200\) must be below steps \(100\)"):
        TrainConfig(**apply_recipe("listops-cpu-tnn", {"steps": 100, "minutes": None}))  # a time budget: no step count to scale by
