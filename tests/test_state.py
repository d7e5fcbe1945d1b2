"""Streaming states: move, select rows, report size, whatever they nest."""

from dataclasses import dataclass, field

import pytest
import torch

from tokenmix.ops.online_toeplitz import OnlineToeplitzState, empty_state
from tokenmix.state import StreamState


@dataclass
class _Block(StreamState):
    """A block's state as blocks will hold them: a part's state, a list of tensors, a position."""

    mixer: OnlineToeplitzState
    caches: list = field(default_factory=list)
    tokens: torch.Tensor | None = None
    position: int = 0


def _block(batch=3):
    mixer = empty_state(batch, 4, capacity=8)
    mixer.inputs.copy_(torch.arange(batch, dtype=torch.float32)[:, None, None].expand_as(mixer.inputs))
    caches = [torch.randn(batch, 2, 5), torch.randn(batch, 7)]
    return _Block(mixer, caches, torch.arange(batch)[:, None].repeat(1, 2), position=11)


def test_select_keeps_the_chosen_rows_of_every_tensor_in_order():
    state = _block()
    chosen = state.select([2, 0, 0])
    assert chosen.mixer.inputs[:, 0, 0].tolist() == [2.0, 0.0, 0.0]
    assert torch.equal(chosen.caches[0], state.caches[0][[2, 0, 0]]) and torch.equal(chosen.tokens[:, 0], torch.tensor([2, 0, 0]))
    assert chosen.position == 11 and chosen.mixer.position == state.mixer.position and chosen.batch_size == 3
    assert state.batch_size == 3 and state.mixer.inputs[:, 0, 0].tolist() == [0.0, 1.0, 2.0]  # the original is untouched
    assert state.select([]).batch_size == 0  # no rows (an empty list is not a float tensor)


def test_concat_joins_rows_and_assign_writes_them_in_place_refusing_states_that_differ():
    state = _block()
    joined = type(state).concat([state, state.select([1])])
    assert joined.batch_size == 4 and joined.mixer.inputs[:, 0, 0].tolist() == [0.0, 1.0, 2.0, 1.0]
    inputs = state.mixer.inputs
    written = state.assign([0, 2], joined.select([3, 3]))
    assert written.mixer.inputs is inputs and inputs[:, 0, 0].tolist() == [1.0, 1.0, 1.0]  # in place
    moved = state.select([0])
    moved.position = 12
    with pytest.raises(ValueError, match="position"):
        type(state).concat([state, moved])
    with pytest.raises(ValueError, match="rows"):
        state.assign([0], state)


def test_to_converts_floating_tensors_only_and_nbytes_counts_every_tensor():
    state = _block()
    double = state.to(dtype=torch.float64)
    assert double.mixer.pending.dtype == torch.float64 and double.caches[1].dtype == torch.float64
    assert double.tokens.dtype == torch.long
    floats = 2 * 3 * 8 * 4 + 3 * 2 * 5 + 3 * 7
    longs = 3 * 2 + 3  # the tokens, the online product's ends
    assert state.nbytes() == 4 * floats + 8 * longs
    assert double.nbytes() == 8 * floats + 8 * longs


def test_to_returns_a_copy_even_when_nothing_moves():
    state = _block()
    copy = state.to()
    copy.mixer.inputs.add_(1.0)
    copy.caches[0].zero_()
    assert state.mixer.inputs[:, 0, 0].tolist() == [0.0, 1.0, 2.0] and state.caches[0].abs().sum() > 0


def test_bad_rows_and_mixed_batch_sizes_are_refused():
    state = _block()
    with pytest.raises(ValueError, match=r"row numbers in \[0, 3\)"):
        state.select([3])
    with pytest.raises(ValueError, match=r"row numbers in \[0, 3\)"):
        state.select([-1])
    with pytest.raises(ValueError, match="1-D"):
        state.select([[0]])
    with pytest.raises(ValueError, match="integer row numbers, got dtype torch.bool"):
        state.select(torch.tensor([True, False, True]))
    state.caches.append(torch.zeros(4, 1))
    with pytest.raises(ValueError, match=r"share one batch size, got \[3, 4\]"):
        state.select([0])


def test_assigning_a_shorter_history_clears_the_rest_of_the_row_and_a_longer_one_widens_the_field():
    wide, narrow = empty_state(2, 4, capacity=16), empty_state(1, 4, capacity=8)
    wide.pending.fill_(5.0)  # an earlier stream's sums for future positions
    narrow.pending.fill_(1.0)
    written = wide.assign([1], narrow)
    assert written.pending[1, :8].eq(1).all() and written.pending[1, 8:].eq(0).all() and written.pending[0].eq(5).all()
    widened = narrow.assign([0], empty_state(1, 4, capacity=32))
    assert widened.inputs.shape == (1, 32, 4)
