"""Adding a mixer is one file: this one (docs/architecture.md, "Adding a mixer").

It defines a cumulative mean, y_t = w * mean(x_s : s <= t, s real) (causal; bidirectional: the mean
of the whole sequence), registers it through the public API and runs every registry contract test
on it, unchanged: ``test_contracts``, ``test_streaming``, ``test_contract_guards``,
``test_option_types`` and ``test_double_backward`` collect their cases from ``list_mixers()``, so a
pytest run that loads this file as a plugin (``-p test_custom_mixer``, which registers the mixer
before collection) holds the new mixer to all of them. The tests below it need the mixer
registered, so they run inside that run too, and are skipped where it is not (the main run, whose
registry must stay the package's own).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from locations import TESTS
from torch import nn

import tokenmix
from tokenmix.fields import Number, setting
from tokenmix.generation import naive_generate
from tokenmix.mixers import Mixer, register_mixer
from tokenmix.mixers.base import PADDING_SIDES
from tokenmix.options import Options
from tokenmix.state import StreamState

NAME = "cumulative_mean"
CONTRACT_SUITE = [  # relative to the tests folder
    "mixers/test_contracts.py",
    "mixers/test_streaming.py",
    "mixers/test_contract_guards.py",
    "mixers/test_option_types.py",
    "ops/test_double_backward.py",
]
THIS_FILE = Path(__file__).resolve().relative_to(TESTS).as_posix()


@dataclass
class RunningMean(StreamState):
    """The sum of the real inputs so far, (batch, dim), and their count, (batch, 1): one size at every position."""

    total: torch.Tensor
    count: torch.Tensor


@dataclass
class CumulativeMeanOptions(Options):
    initial_scale: float = setting(1.0, Number(), "the learned scale per channel at initialisation")


class CumulativeMean(Mixer):
    """The mean of the real tokens so far (causal) or of all of them, times a learned scale per channel."""

    options_type = CumulativeMeanOptions
    padding_invariant_sides = PADDING_SIDES  # the mean counts real tokens only
    channelwise_linear = True
    bounded_state = True
    state_type = RunningMean

    def __init__(self, dim: int, causal: bool = False, options: CumulativeMeanOptions | None = None):
        super().__init__(dim, causal, options)  # self.options: these options, or the defaults when None
        self.scale = nn.Parameter(torch.full((dim,), self.options.initial_scale))

    def mix(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        real = x.new_ones(x.shape[:2] + (1,)) if mask is None else mask[..., None].to(x.dtype)
        if self.causal:
            return self.scale.to(x.dtype) * x.cumsum(1) / real.cumsum(1).clamp_min(1)
        mean = x.sum(1, keepdim=True) / real.sum(1, keepdim=True).clamp_min(1)
        return (self.scale.to(x.dtype) * mean).expand_as(x)

    def empty_state(self, batch_size: int, device, dtype: torch.dtype, max_length: int | None) -> RunningMean:
        zeros = torch.zeros(batch_size, self.dim + 1, device=device, dtype=dtype)
        return RunningMean(zeros[:, :-1], zeros[:, -1:])

    def step_chunk(self, x: torch.Tensor, state: RunningMean, mask: torch.Tensor | None) -> tuple[torch.Tensor, RunningMean]:
        real = x.new_ones(x.shape[:2] + (1,)) if mask is None else mask[..., None].to(x.dtype)
        totals, counts = state.total[:, None] + x.cumsum(1), state.count[:, None] + real.cumsum(1)
        return self.scale.to(x.dtype) * totals / counts.clamp_min(1), RunningMean(totals[:, -1], counts[:, -1])


def pytest_configure(config):
    """Loaded as a plugin (``-p test_custom_mixer``): register the mixer before the suite collects its cases."""
    register_mixer(NAME)(CumulativeMean)


def test_every_registry_contract_test_passes_on_a_mixer_defined_in_this_file():
    here = str(Path(__file__).parent)  # so that ``-p test_custom_mixer`` finds this file
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([here, str(TESTS), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "pytest", "-v", "-n", "0", "-p", "no:cacheprovider", "-p", Path(__file__).stem]
    command += [*CONTRACT_SUITE, THIS_FILE, "-k", NAME]
    run = subprocess.run(command, cwd=TESTS, env=environment, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-2000:]
    outcomes = re.findall(r"^(\S+?)::\S+ (PASSED|FAILED|SKIPPED|ERROR)", run.stdout, re.MULTILINE)
    assert {outcome for _, outcome in outcomes} == {"PASSED"}
    assert {file for file, _ in outcomes} == {*CONTRACT_SUITE, THIS_FILE}  # every file of the suite held it to something


@pytest.fixture
def registered():
    if NAME not in tokenmix.list_mixers():
        pytest.skip("runs where -p test_custom_mixer registered the mixer")


@pytest.mark.parametrize("causal", [False, True])
def test_cumulative_mean_matches_its_python_loop(causal, registered):
    layer = tokenmix.build_mixer(NAME, 3, causal, initial_scale=0.5).double()
    x = torch.randn(2, 9, 3, dtype=torch.float64)
    expected = torch.stack([x[:, : t + 1].mean(1) if causal else x.mean(1) for t in range(9)], dim=1) * 0.5
    torch.testing.assert_close(layer(x), expected)


def test_the_mixer_is_built_from_its_options_dataclass_too():
    """Its constructor takes the typed options (``build_mixer`` resolves flat keywords into them), or none for the defaults."""
    built = CumulativeMean(3, True, CumulativeMeanOptions(initial_scale=0.5))
    assert built.options == CumulativeMeanOptions(initial_scale=0.5) and torch.equal(built.scale, torch.full((3,), 0.5))
    assert CumulativeMean(3).options == CumulativeMeanOptions()
    with pytest.raises(ValueError, match="initial_scale must be a finite number"):
        CumulativeMeanOptions(initial_scale=float("nan"))
    with pytest.raises(ValueError, match="options of CumulativeMean must be a CumulativeMeanOptions"):
        CumulativeMean(3, True, Options())


def test_a_language_model_with_a_cumulative_mean_saves_loads_and_generates(tmp_path, registered):
    net = tokenmix.build_model("tnn", task="lm", vocab_size=20, dim=8, depth=2, mixer=NAME).eval()
    net.save_pretrained(tmp_path)
    loaded = tokenmix.open_run(tmp_path).model.eval()
    prompt = torch.tensor([3, 1, 4, 1, 5])
    generated = tokenmix.generate(loaded, [prompt], max_new_tokens=12, temperature=0)[0]
    torch.testing.assert_close(generated, naive_generate(net, prompt, 12))
