"""``TokenmixConfig``: a transformers config holding a tokenmix model's resolved config."""

from __future__ import annotations

from transformers import PreTrainedConfig

from ..models.config import ModelConfig
from ..runs.migrations import read_model_config, with_segment_length


class TokenmixConfig(PreTrainedConfig):
    """``tokenmix`` is the model's ``ModelConfig.to_dict()``: its name, task, sizes and every
    resolved option (defaults included, with a format version), so the model rebuilds exactly.
    ``segment_length``: read from exports written before XL models recorded their segment in
    ``tokenmix``; ``vocab_size`` and ``hidden_size`` mirror the tokenmix config for tools that read them."""

    model_type = "tokenmix"
    tokenmix: dict | None = None
    segment_length: int | None = None
    vocab_size: int | None = None
    hidden_size: int | None = None
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    use_cache: bool = True
    tie_word_embeddings: bool = True  # logits are hidden states times the input embedding

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        if self.tokenmix is not None:
            config = read_model_config(self.tokenmix)  # ValueError for a config this tokenmix cannot read
            self.vocab_size, self.hidden_size = config.vocab_size, config.dim

    def model_config(self, **changes) -> ModelConfig:
        """The tokenmix ModelConfig, with ``changes`` (a head's task and classes)."""
        if self.tokenmix is None:
            raise ValueError("TokenmixConfig needs tokenmix=ModelConfig.to_dict() of the model it describes")
        return with_segment_length(read_model_config({**self.tokenmix, **changes}), self.tokenmix, self.segment_length)
