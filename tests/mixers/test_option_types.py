"""Every option of every mixer and model is type-checked: a value of the wrong type is a ValueError
naming it, never read as truthy or cast (``causal="no"`` once built a causal mixer)."""

import pytest
from test_contracts import DIM, MODEL_TASKS, MODES, SMALL

import tokenmix
from tokenmix.mixers.registry import resolve_mixer_options
from tokenmix.models.registry import resolve_model_options


def wrong_type(value):
    """A value of another type than ``value``'s (a string for numbers and flags, a number for strings)."""
    if isinstance(value, str):
        return 5
    if isinstance(value, bool):
        return "yes"
    if isinstance(value, (int, float)):
        return "1"
    return "x" if value is None else [["x"]]


@pytest.mark.parametrize(("name", "causal"), MODES)
def test_mixer_options_of_the_wrong_type_are_refused(name, causal):
    """Fails if ``check_option_type`` (tokenmix/options.py) or a constructor's own check is removed."""
    with pytest.raises(ValueError, match="causal must be True or False, got 'no'"):
        tokenmix.build_mixer(name, DIM, causal="no")
    resolved = resolve_mixer_options(name, SMALL.get(name, {}), DIM)
    for key, value in resolved.items():
        with pytest.raises(ValueError, match=key):
            tokenmix.build_mixer(name, DIM, causal, **{**resolved, key: wrong_type(value)})


@pytest.mark.parametrize(("name", "task"), MODEL_TASKS)
def test_model_options_of_the_wrong_type_are_refused(name, task):
    extra = {"num_classes": 3} if task == "classify" else {}
    resolved = resolve_model_options(name, {}, 16, 2)
    for key, value in resolved.items():
        with pytest.raises(ValueError):
            tokenmix.build_model(name, task=task, vocab_size=20, dim=16, depth=2, **extra, **{**resolved, key: wrong_type(value)})
