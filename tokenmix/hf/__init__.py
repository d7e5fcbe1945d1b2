"""Hugging Face transformers integration (optional: ``pip install "tokenmix[hf]"``).

Importing ``tokenmix.hf`` registers ``TokenmixConfig`` (``model_type = "tokenmix"``) and its models
with ``AutoConfig``, ``AutoModel``, ``AutoModelForCausalLM``, ``AutoModelForMaskedLM`` and
``AutoModelForSequenceClassification``, so a directory written by ``export`` (or ``tokenmix
export-hf``) loads with ``from_pretrained`` offline, and ``generate()`` decodes with tokenmix's
streaming state (docs/hf.md).
"""

from __future__ import annotations

try:
    import transformers  # noqa: F401
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError('tokenmix.hf needs Hugging Face transformers: pip install "tokenmix[hf]"') from error

from .cache import TokenmixCache
from .configuration import TokenmixConfig
from .export import export, hf_tokenizer
from .modeling import (
    TokenmixForCausalLM,
    TokenmixForMaskedLM,
    TokenmixForSequenceClassification,
    TokenmixModel,
    TokenmixPreTrainedModel,
    register,
)

register()

__all__ = [
    "TokenmixCache",
    "TokenmixConfig",
    "TokenmixForCausalLM",
    "TokenmixForMaskedLM",
    "TokenmixForSequenceClassification",
    "TokenmixModel",
    "TokenmixPreTrainedModel",
    "export",
    "hf_tokenizer",
]
