"""Speed of token mixers against the FFT floor (issue: TNO <= 1.3x eval, <= 3.5x train).

The floor is a bare ``irfft(rfft(x, N), N)`` round trip of the same (batch, length, channels)
tensor along the length dimension at the same FFT size N a spectral mixer uses.
"""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass

import torch

from ..mixers.registry import build_mixer
from ..ops.fft import fast_fft_size
from .timing import median_ms


@dataclass
class Measurement:
    mixer: str
    causal: bool
    length: int
    batch: int
    dim: int
    dtype: str
    device: str
    threads: int
    torch: str
    forward_ms: float
    forward_backward_ms: float
    fft_floor_ms: float | None
    fwd_ratio_to_fft: float | None
    fwdbwd_ratio_to_fft: float | None
    peak_mem_mb: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def fft_floor_ms(x: torch.Tensor, repeats: int) -> float:
    n = x.shape[1]
    size = fast_fft_size(2 * n)

    def round_trip():
        with torch.no_grad():
            return torch.fft.irfft(torch.fft.rfft(x.float(), n=size, dim=1), n=size, dim=1)[:, :n]

    return median_ms(round_trip, x.device, repeats)


def measure_mixer(
    name: str,
    length: int,
    *,
    dim: int = 1536,
    batch_tokens: int = 4096,
    causal: bool = False,
    dtype=torch.float32,
    device="cpu",
    repeats: int = 7,
    **options,
) -> Measurement:
    """Eval-mode forward (no autograd) and training-mode forward+backward of one mixer."""
    device = torch.device(device)
    batch = max(1, batch_tokens // length)
    torch.manual_seed(0)
    mixer = build_mixer(name, dim, causal, **options).to(device=device, dtype=dtype)
    x = torch.randn(batch, length, dim, device=device, dtype=dtype)
    grad = torch.randn_like(x)

    mixer.eval()

    def forward():
        with torch.no_grad():
            return mixer(x)

    forward_ms = median_ms(forward, device, repeats)
    mixer.train()
    x_train = x.clone().requires_grad_(True)
    parameters = [p for p in mixer.parameters() if p.requires_grad]

    def forward_backward():
        torch.autograd.grad(mixer(x_train), [x_train, *parameters], grad)

    forward_backward_ms = median_ms(forward_backward, device, repeats)
    floor = fft_floor_ms(x, repeats) if mixer.fft_based else None
    return Measurement(
        mixer=name,
        causal=causal,
        length=length,
        batch=batch,
        dim=dim,
        dtype=str(dtype).removeprefix("torch."),
        device=str(device),
        threads=torch.get_num_threads(),
        torch=torch.__version__,
        forward_ms=forward_ms,
        forward_backward_ms=forward_backward_ms,
        fft_floor_ms=floor,
        fwd_ratio_to_fft=forward_ms / floor if floor else None,
        fwdbwd_ratio_to_fft=forward_backward_ms / floor if floor else None,
    )


def describe_machine() -> str:
    return f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}"
