"""Streaming states: small dataclasses of tensors that decoding carries from one chunk to the next.

A state's fields are tensors with the batch first, positions (ints), or nested states (a block
holds its parts' states; a model a list of its blocks'). ``StreamState`` gives every such
dataclass what generation needs without knowing what is inside: move it to a device (``to``),
keep some rows of the batch, in any order (``select``, for batched generation and beam search),
say how much memory it holds (``nbytes``), and hear how far each row will go (``limit_steps``:
work only later positions need may be skipped). ``to_plain`` / ``StreamState.from_plain`` turn a
state into nested dicts and lists of tensors and numbers and back, so a checkpoint holding one
loads with ``torch.load(weights_only=True)``: only registered state classes are rebuilt, from
their own fields.
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar

import torch

S = TypeVar("S", bound="StreamState")


def _map(value, tensor_fn):
    """``value`` with every tensor inside replaced by ``tensor_fn(tensor)`` (states, lists and tuples walked)."""
    if isinstance(value, torch.Tensor):
        return tensor_fn(value)
    if isinstance(value, StreamState):
        return dataclasses.replace(value, **{f.name: _map(getattr(value, f.name), tensor_fn) for f in dataclasses.fields(value)})
    if isinstance(value, (list, tuple)):
        return type(value)(_map(item, tensor_fn) for item in value)
    return value


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, StreamState):
        for field in dataclasses.fields(value):
            yield from _tensors(getattr(value, field.name))
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def _limit_steps(value, steps: torch.Tensor):
    if isinstance(value, StreamState):
        return value.limit_steps(steps)
    if isinstance(value, (list, tuple)):
        return type(value)(_limit_steps(item, steps) for item in value)
    return value


_STATE_CLASSES: dict[str, type[StreamState]] = {}
STATE_TYPE_KEY = "__state__"  # in a plain state: the class name


def _plain(value):
    if isinstance(value, StreamState):
        return value.to_plain()
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _from_plain(value, where: str):
    if isinstance(value, dict):
        return StreamState.from_plain(value, where)
    if isinstance(value, list):
        return [_from_plain(item, f"{where}[{index}]") for index, item in enumerate(value)]
    if value is None or isinstance(value, (torch.Tensor, int, float, str)):
        return value
    raise ValueError(f"{where} holds a {type(value).__name__}; a saved state holds tensors, numbers, strings and nested states")


@dataclasses.dataclass
class StreamState:
    """Base of every streaming state dataclass (fields: batch-first tensors, ints, nested states)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _STATE_CLASSES[cls.__name__] = cls  # saved states name their class: the package's names are unique (tested)

    def to_plain(self) -> dict:
        """The state as a dict of its fields (nested states as dicts, tuples as lists) and its class name."""
        return {STATE_TYPE_KEY: type(self).__name__, **{f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}}

    @staticmethod
    def from_plain(data: dict, where: str = "state") -> StreamState:
        """The state ``to_plain`` gave; ValueError (naming ``where``) for an unknown class or fields."""
        if not isinstance(data, dict):
            raise ValueError(f"{where} is not a saved streaming state (a dict of its fields), got {type(data).__name__}")
        cls = _STATE_CLASSES.get(data.get(STATE_TYPE_KEY)) if isinstance(data.get(STATE_TYPE_KEY), str) else None
        if cls is None:
            named = data.get(STATE_TYPE_KEY)
            raise ValueError(f"{where} is not a saved streaming state (its {STATE_TYPE_KEY!r} names no state class: {named!r})")
        names = {f.name for f in dataclasses.fields(cls)}
        given = {key: value for key, value in data.items() if key != STATE_TYPE_KEY}
        missing = dataclasses.MISSING
        required = {f.name for f in dataclasses.fields(cls) if f.default is missing and f.default_factory is missing}
        if set(given) - names or required - set(given):
            raise ValueError(f"{where} ({cls.__name__}) has fields {sorted(map(str, given))}; expected {sorted(names)}")
        return cls(**{key: _from_plain(value, f"{where}.{key}") for key, value in given.items()})

    def to(self: S, device=None, dtype: torch.dtype | None = None) -> S:
        """A copy on ``device``; ``dtype`` converts the floating point tensors only."""

        def move(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.to(device=device, dtype=dtype if dtype is not None and tensor.is_floating_point() else None, copy=True)

        return _map(self, move)

    def select(self: S, index: torch.Tensor | list[int]) -> S:
        """The state of the batch rows ``index`` (a 1-D tensor or list of row numbers, repeats allowed)."""
        index = torch.as_tensor(index, dtype=torch.long if isinstance(index, (list, tuple)) and not index else None)  # [] is no rows
        if index.dtype == torch.bool or index.is_floating_point():
            raise ValueError(f"index must be integer row numbers, got dtype {index.dtype} (for a bool mask, pass mask.nonzero()[:, 0])")
        index = index.long()
        if index.dim() != 1:
            raise ValueError(f"index must be 1-D row numbers, got shape {tuple(index.shape)}")
        size = self.batch_size
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= size):
            raise ValueError(f"index must hold row numbers in [0, {size}), got {index.tolist()}")
        return _map(self, lambda tensor: tensor.index_select(0, index.to(tensor.device)))

    @classmethod
    def concat(cls: type[S], states: list[S]) -> S:
        """One state holding the rows of ``states`` in order (the inverse of ``select``): states of this
        class whose every non-tensor field (position, horizon, segment length...) is equal; ValueError
        naming the first field that differs. Continuous batching adds a new stream to a batch this way."""
        if not states or any(type(state) is not cls for state in states):
            raise ValueError(f"concat needs a non-empty list of {cls.__name__}s, got {[type(state).__name__ for state in states]}")
        return _concat(states, cls.__name__, None)

    def assign(self: S, rows: list[int], other: S) -> S:
        """This state with its rows ``rows`` replaced by the rows of ``other`` (alike in every non-tensor
        field), written in place where the shapes allow: a server reuses the rows of finished streams
        for new ones without copying the others. Returns the state (a field is replaced only where
        ``other``'s needs more room, as a longer history)."""
        if type(other) is not type(self) or other.batch_size != len(rows):
            raise ValueError(f"assign needs a {type(self).__name__} of {len(rows)} rows, got {type(other).__name__}")
        return _concat([self, other], type(self).__name__, None, rows)

    @classmethod
    def assign_tensor(cls, name: str, mine: torch.Tensor, rows: list[int], theirs: torch.Tensor) -> torch.Tensor:
        """Field ``name``'s ``mine`` with rows ``rows`` set to ``theirs``, in place (the shapes past the batch must agree)."""
        if mine.shape[1:] != theirs.shape[1:]:
            raise ValueError(f"{cls.__name__}.{name} has shapes {tuple(mine.shape[1:])} and {tuple(theirs.shape[1:])} past the batch")
        mine[rows] = theirs.to(mine.dtype)
        return mine

    @classmethod
    def concat_tensors(cls, name: str, tensors: list[torch.Tensor]) -> torch.Tensor:
        """Field ``name``'s tensors joined along the batch: they must agree past it (a class whose
        fields have a capacity that grows on its own, such as the online product's, widens them first)."""
        shapes = {tuple(tensor.shape[1:]) for tensor in tensors}
        if len(shapes) > 1:
            raise ValueError(f"{cls.__name__}.{name} has shapes {sorted(shapes)} past the batch: streams at different positions?")
        return torch.cat(tensors)

    def limit_steps(self: S, steps: torch.Tensor) -> S:
        """This state, told that row r will be stepped at most ``steps[r]`` more tokens (a 1-D integer
        tensor, a count per row; a server and ``generate`` know each request's end). A state that can
        skip work only later positions need (the online Toeplitz product adds each tile to the outputs
        of every row's future up to the furthest end, ``ops/online_toeplitz.py``) does; a row stepped
        further than it said gets inexact outputs. Nested states are told too; the others ignore it."""
        return dataclasses.replace(self, **{f.name: _limit_steps(getattr(self, f.name), steps) for f in dataclasses.fields(self)})

    def tensors(self) -> list[torch.Tensor]:
        """The state's tensors, nested states' included, in a fixed order (the buffers a CUDA graph reads)."""
        return list(_tensors(self))

    def copy_(self: S, other: S) -> S:
        """Write ``other``'s tensors into this state's, in place (alike: the same class, and tensors of the same
        shapes in the same places); its other fields stay. A static decoder keeps a stream in fixed buffers this way
        (``Mixer.static_step``). Returns the state."""
        mine, theirs = self.tensors(), other.tensors()
        if type(other) is not type(self) or [t.shape for t in mine] != [t.shape for t in theirs]:
            raise ValueError(f"copy_ needs a {type(self).__name__} with tensors of the same shapes, got a {type(other).__name__}")
        for target, source in zip(mine, theirs, strict=True):
            if target is not source:
                target.copy_(source)
        return self

    def nbytes(self) -> int:
        """Bytes held by the state's tensors."""
        return sum(tensor.numel() * tensor.element_size() for tensor in _tensors(self))

    @property
    def batch_size(self) -> int:
        """The batch size: the first dimension shared by every tensor (ValueError if they disagree)."""
        sizes = {tensor.shape[0] for tensor in _tensors(self)}
        if len(sizes) != 1:
            raise ValueError(f"a state's tensors must share one batch size, got {sorted(sizes)}")
        return sizes.pop()

    @property
    def floating_dtypes(self) -> set[torch.dtype]:
        """The dtypes of the state's floating point tensors."""
        return {tensor.dtype for tensor in _tensors(self) if tensor.is_floating_point()}


def _concat(values: list, where: str, join, rows: list[int] | None = None):
    """``values`` (one per state, alike) as one: tensors by ``join``, states field by field, lists item by
    item; anything else must be equal. With ``rows``: the second's rows written into the first's
    ``rows`` instead (``StreamState.assign``)."""
    first = values[0]
    if isinstance(first, torch.Tensor):
        return join(values)
    if isinstance(first, StreamState):
        if any(type(value) is not type(first) for value in values):
            raise ValueError(f"{where} holds states of classes {sorted({type(value).__name__ for value in values})}")

        def joiner(name: str):
            if rows is None:
                return lambda tensors: type(first).concat_tensors(name, tensors)
            return lambda tensors: type(first).assign_tensor(name, tensors[0], rows, tensors[1])

        fields = dataclasses.fields(first)
        joined = {f.name: _concat([getattr(value, f.name) for value in values], f"{where}.{f.name}", joiner(f.name), rows) for f in fields}
        return type(first)(**joined)
    if isinstance(first, (list, tuple)):
        if any(not isinstance(value, type(first)) or len(value) != len(first) for value in values):
            raise ValueError(f"{where} holds lists of different lengths")
        return type(first)(_concat([value[index] for value in values], f"{where}[{index}]", join, rows) for index in range(len(first)))
    if any(value != first for value in values):
        raise ValueError(f"{where} differs between the states ({sorted({repr(value) for value in values})}): they cannot share a batch")
    return first


def check_state(state, expected: type[StreamState], batch_size: int | None, dtype: torch.dtype | None, owner: str) -> None:
    """ValueError unless ``state`` is an ``expected`` state for ``batch_size`` rows holding ``dtype``
    (None: not checked here; a block's or model's parts check their own).

    ``owner`` names what the state is for ("this 6-channel Tno", "model 'tnn'") in the message.
    """
    if not isinstance(state, expected):
        raise ValueError(f"state must be a {expected.__name__} made by {owner}'s init_state, got {type(state).__name__}")
    sizes = set() if batch_size is None else {tensor.shape[0] for tensor in _tensors(state)}
    if sizes and sizes != {batch_size}:
        raise ValueError(
            f"state holds batch size {sorted(sizes)} but the input has {batch_size} rows; init_state({batch_size}) or state.select(rows)"
        )
    dtypes = state.floating_dtypes
    if dtype is not None and dtypes and dtypes != {dtype}:
        names = ", ".join(sorted(str(d) for d in dtypes))
        raise ValueError(
            f"state holds {names} but {owner} streams this input in {dtype}; init_state(..., dtype=x.dtype) or state.to(dtype=...)"
        )
