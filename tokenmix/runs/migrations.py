"""Every upgrade of a file an older tokenmix wrote, each a function named for what changed, applied in turn.

Model configs (``models/config.py``, ``FORMAT_VERSION``): ``read_model_config`` checks a config's
format and keys, then applies ``CONFIG_MIGRATIONS[v]`` from its format ``v`` up to today's, each
bringing format ``v`` to ``v + 1``. Configs written before segment-recurrent (XL) models recorded their
``segment_length`` get the segment they were trained with (``with_segment_length``; the streams a
checkpoint saved with them, ``signature_with_segment_length``). Training checkpoints of format 1
(tokenmix 0.2 and earlier) become format 2 in ``checkpoint_format_1_to_2`` once ``legacy.py`` has
unpickled them for a user who trusts them.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import MISSING, dataclass, fields

import numpy as np
import torch

from ..data.sources import source_kind
from ..data.tokenizer import byte_tokenizer
from ..models.config import FORMAT_KEYS, FORMAT_VERSION, ModelConfig, config_format
from ..models.model import SequenceModel


def config_format_1_to_2(data: dict) -> dict:
    """Format 1 (tokenmix 0.1, no ``format_version``) recorded only the options and fields passed by hand:
    today's defaults fill in the rest, with a warning that they may differ from those it was trained with."""
    warnings.warn(
        "this config predates tokenmix 0.2 (format 1) and records only the options passed by hand; "
        "today's defaults fill in the rest, which may differ from those it was trained with",
        stacklevel=3,
    )
    defaults = {field.name: field.default for field in fields(ModelConfig) if field.name in FORMAT_KEYS[1] and field.default is not MISSING}
    return {"options": {}, **defaults, **data, "format_version": 2, "tokenmix_version": "0.1"}


def config_format_2_to_3(data: dict) -> dict:
    """Format 3 added the classification head's ``pool`` and ``documents``: a format 2 head was the only one
    there was, the mean over one document."""
    return {**data, "pool": "mean", "documents": 1, "format_version": 3}


def config_format_3_to_4(data: dict) -> dict:
    """Up to format 3 Transformer-XL's attention was its block's own part, ``mixer="attention"``, beside an
    unused FNetAR ``window``; since format 4 it is the registered ``relative_attention`` mixer."""
    options = data.get("options")
    if data.get("name") == "transformer_xl" and isinstance(options, dict) and options.get("mixer", "attention") == "attention":
        options = {key: value for key, value in options.items() if key != "window"}
        data = {**data, "options": {**options, "mixer": "relative_attention"} if "mixer" in options else options}
    return {**data, "format_version": 4}


def config_format_4_to_5(data: dict) -> dict:
    """Up to format 4 options were flat, a MEGA-style block's TCN depth ``tcn_depth`` (None without a TCN);
    flat options still resolve (``mixers/parts.py``), the TCN's depth as ``depth``."""
    options = data.get("options")
    if isinstance(options, dict) and "tcn_depth" in options:
        depth = options["tcn_depth"]
        options = {key: value for key, value in options.items() if key != "tcn_depth"}
        data = {**data, "options": options if depth is None else {**options, "depth": depth}}
    return {**data, "format_version": 5}


CONFIG_MIGRATIONS = {1: config_format_1_to_2, 2: config_format_2_to_3, 3: config_format_3_to_4, 4: config_format_4_to_5}
assert sorted(CONFIG_MIGRATIONS) == list(range(1, FORMAT_VERSION)), "a migration for each older config format"


def read_model_config(data: dict) -> ModelConfig:
    """A saved model config of any format this tokenmix reads, upgraded to today's; ValueError (from
    ``models.config``) on a newer format or keys its format does not have."""
    for version in range(config_format(data), FORMAT_VERSION):
        data = CONFIG_MIGRATIONS[version](data)
    return ModelConfig.from_dict(data)


def with_segment_length(config: ModelConfig, saved: dict, segment_length: int | None) -> ModelConfig:
    """A config written before segment-recurrent (XL) models recorded their ``segment_length``: the
    segment they were trained with (the run's ``--seq-len``, or an export's field) where the model
    takes one and the ``saved`` config dict lacks it."""
    if segment_length is not None and "segment_length" in config.options and "segment_length" not in saved.get("options", {}):
        config.options["segment_length"] = segment_length
    return config


def signature_with_segment_length(signature: str, config: ModelConfig) -> str:
    """A saved stream's model signature (its model's config JSON) from before XL models recorded their
    ``segment_length``: ``config``'s where they differ in nothing else, else unchanged."""
    try:
        saved = json.loads(signature)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a format 1 config's: the checkpoint's own config warned already
            migrated = with_segment_length(read_model_config(saved), saved, config.options.get("segment_length"))
    except (ValueError, TypeError, AttributeError):
        return signature
    return config.to_json() if migrated.to_json() == config.to_json() else signature


@dataclass
class SegmentState:
    """What format 1 checkpoints written before streaming states held for an XL model's stream: each block's memory."""

    memory: list
    position: int = 0


def checkpoint_format_1_to_2(state: dict) -> dict:
    """A format 1 checkpoint (tokenmix 0.2 and earlier, unpickled by ``legacy.py``) as format 2 holds it: RNG
    states, XL streams and the tokenizer as tensors, numbers, strings and plain dicts (the ``checkpoint_format``
    key is the writer's, ``save_checkpoint``)."""
    segment_length = state["train_config"]["seq_len"]
    streams = [_plain_stream(item, state["model_config"], segment_length) for item in state.get("segment_states") or []]
    return {**state, "rng": _plain_rng(state["rng"]), "segment_states": streams or None, "tokenizer": _tokenizer_json(state)}


def _plain_rng(rng: dict) -> dict:
    """Format 1's RNG states (numpy's tuple with an ndarray, Python's tuples) as format 2 stores them."""
    _, keys, position, has_gauss, cached = rng["numpy"]
    version, internal, gauss_next = rng["python"]
    return {
        "torch": rng["torch"],
        "numpy": {
            "keys": torch.from_numpy(np.asarray(keys).astype(np.int64)),
            "position": position,
            "has_gauss": has_gauss,
            "cached": cached,
        },
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
    }


def _plain_stream(state, model_config: dict, segment_length: int):
    """A saved XL stream as a plain dict; ``SegmentState`` memories become the state of the blocks at a segment boundary."""
    if state is None:
        return None
    if isinstance(state, SegmentState):
        model = SequenceModel(with_segment_length(read_model_config(model_config), model_config, segment_length))
        first = state.memory[0]
        modern = model.init_state(first.shape[0], device=first.device, dtype=first.dtype)
        for block, memory in zip(modern.blocks, state.memory, strict=True):
            block.memory, block.position = memory, state.position
        modern.position = state.position
        state = modern
    return state.to_plain()


def _tokenizer_json(state: dict):
    """Format 1 checkpoints written before tokenizers were text runs in bytes."""
    if "tokenizer" in state:
        return state["tokenizer"]
    return byte_tokenizer().to_json() if source_kind(state["train_config"]["data"]) == "corpus" else None
