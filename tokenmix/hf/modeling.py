"""transformers model classes around ``tokenmix.models.SequenceModel``.

Every class holds the tokenmix model as ``self.tokenmix`` (checkpoint keys ``tokenmix.*``), built
from ``config.tokenmix`` with its head's task, so a causal LM's or masked LM's weights load into
``TokenmixModel`` and a masked LM's into ``TokenmixForSequenceClassification`` (a new head).
transformers' ``attention_mask`` (1 = real token) is tokenmix's padding mask; a causal LM reads a
left-padded batch without its padding, so every row generates what its prompt would alone.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
    GenerationMixin,
    PreTrainedModel,
)
from transformers.modeling_outputs import BaseModelOutput, CausalLMOutputWithPast, MaskedLMOutput, SequenceClassifierOutput

from ..models.model import SequenceModel
from .cache import TokenmixCache, padding_mask, read_unpadded
from .configuration import TokenmixConfig


class TokenmixPreTrainedModel(PreTrainedModel):
    """Base of the tokenmix classes: the tokenmix model with the head of ``head_task``."""

    config_class = TokenmixConfig
    base_model_prefix = "tokenmix"
    main_input_name = "input_ids"
    _no_split_modules = None  # one device: the logits use the embedding, states start on the inputs' device
    _is_stateful = True  # a streaming state, not per-position keys and values: no assisted decoding
    head_task: str | None = None  # None: the config's own task

    def __init__(self, config: TokenmixConfig):
        super().__init__(config)
        self.tokenmix = SequenceModel(config.model_config(**self.head_changes(config)))
        config.tokenmix = self.tokenmix.config.to_dict()  # the head it has, so save_pretrained writes this model
        self.post_init()

    def head_changes(self, config: TokenmixConfig) -> dict:
        return {} if self.head_task is None else {"task": self.head_task}

    def get_input_embeddings(self) -> nn.Embedding:
        return self.tokenmix.embedding

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.tokenmix.embedding = value

    def resize_token_embeddings(self, *args, **kwargs):
        raise NotImplementedError("tokenmix models keep the vocabulary they were trained with; resizing is not supported")

    def _init_weights(self, module: nn.Module) -> None:
        """tokenmix initialises its own modules; only a classification head that a loaded checkpoint
        lacks (a new one) is drawn here, as transformers does for new heads."""
        classifier = getattr(getattr(self, "tokenmix", None), "classifier", None)
        if classifier is not None and isinstance(module, nn.Linear) and any(module is part for part in classifier.modules()):
            nn.init.normal_(module.weight, std=0.02)
            nn.init.zeros_(module.bias)


class TokenmixModel(TokenmixPreTrainedModel):
    """The final hidden states (``last_hidden_state``, after the last norm) of any tokenmix model."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs) -> BaseModelOutput:
        hidden, _ = self.tokenmix.hidden_states(input_ids, padding_mask(attention_mask, input_ids.shape[1]))
        return BaseModelOutput(last_hidden_state=hidden)


class TokenmixForCausalLM(TokenmixPreTrainedModel, GenerationMixin):
    """A causal LM; ``generate()`` reads the prompt once and steps the streaming state per token
    (``TokenmixCache``); ``labels`` give the next-token loss (shifted inside, -100 ignored)."""

    head_task = "lm"

    def get_output_embeddings(self) -> nn.Embedding:
        return self.tokenmix.embedding  # tied: logits = hidden states @ embedding.T

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: TokenmixCache | None = None,
        labels: torch.Tensor | None = None,
        use_cache: bool | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """Logits of ``input_ids``; a left-padded batch (``attention_mask``) is read without its
        padding, each row as it would be alone (``cache.read_unpadded``), logits 0 at padding."""
        if inputs_embeds is not None or input_ids is None:
            raise ValueError("tokenmix models read token ids: pass input_ids (inputs_embeds is not supported)")
        use_cache = use_cache if use_cache is not None else (self.config.use_cache and not self.training)
        if use_cache or past_key_values is not None:
            # a cache started here plans for this input (an FD-TNO's grid is that of its horizon: see docs/inference.md)
            cache = past_key_values if past_key_values is not None else TokenmixCache(max_length=input_ids.shape[1])
            logits = cache.read(self.tokenmix, input_ids, attention_mask)
        else:
            cache, logits = None, read_unpadded(self.tokenmix, input_ids, attention_mask)
        loss = None if labels is None else self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        return CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=cache)

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the cache is a TokenmixCache, never transformers' key/value DynamicCache

    def _prepare_cache_for_generation(self, generation_config, model_kwargs: dict, *args, **kwargs) -> None:
        """A TokenmixCache planned for the whole generation (prompt and new tokens): operators that
        depend on the length (FD-TNO's grid, an automatic TCN dilation) use that horizon."""
        if generation_config.cache_implementation is not None:
            raise ValueError(
                f"cache_implementation={generation_config.cache_implementation!r}: tokenmix models decode with TokenmixCache only"
            )
        if model_kwargs.get("past_key_values") is None and generation_config.use_cache is not False:
            model_kwargs["past_key_values"] = TokenmixCache(max_length=generation_config.max_length)


class TokenmixForMaskedLM(TokenmixPreTrainedModel):
    """A bidirectional masked LM; ``labels`` (-100 where nothing is predicted) give its loss."""

    head_task = "mlm"

    def get_output_embeddings(self) -> nn.Embedding:
        return self.tokenmix.embedding

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None, **kwargs
    ) -> MaskedLMOutput:
        logits = self.tokenmix(input_ids, padding_mask(attention_mask, input_ids.shape[1]))
        loss = None if labels is None else self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        return MaskedLMOutput(loss=loss, logits=logits)


class TokenmixForSequenceClassification(TokenmixPreTrainedModel):
    """A bidirectional classifier with ``config.num_labels`` outputs (1: a regressed score), pooled
    as the tokenmix config says (mean of the real tokens by default)."""

    head_task = "classify"

    def head_changes(self, config: TokenmixConfig) -> dict:
        return {"task": "classify", "num_classes": config.num_labels}

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None, **kwargs
    ) -> SequenceClassifierOutput:
        logits = self.tokenmix(input_ids, padding_mask(attention_mask, input_ids.shape[-1]))
        loss = None if labels is None else self.loss_function(labels=labels, pooled_logits=logits, config=self.config)
        return SequenceClassifierOutput(loss=loss, logits=logits)


AUTO_CLASSES = {
    AutoModel: TokenmixModel,
    AutoModelForCausalLM: TokenmixForCausalLM,
    AutoModelForMaskedLM: TokenmixForMaskedLM,
    AutoModelForSequenceClassification: TokenmixForSequenceClassification,
}


def register() -> None:
    """Make ``model_type = "tokenmix"`` known to the Auto classes (done on ``import tokenmix.hf``)."""
    AutoConfig.register(TokenmixConfig.model_type, TokenmixConfig, exist_ok=True)
    for auto, model_class in AUTO_CLASSES.items():
        auto.register(TokenmixConfig, model_class, exist_ok=True)
