"""Generation from a causal language model: decode loops over the streaming state or static buffers (CUDA graphs),
sampling, stop rules."""

from .decode import generate, naive_generate
from .graphs import StaticDecoder
from .sampling import check_sampling, choose_tokens, row_generator
from .stops import Stop, StopRule

__all__ = ["StaticDecoder", "Stop", "StopRule", "check_sampling", "choose_tokens", "generate", "naive_generate", "row_generator"]
