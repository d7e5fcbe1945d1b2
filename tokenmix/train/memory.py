"""The memory a training run will need, estimated before it starts, so that a run that cannot fit is
refused with the figure instead of being killed hours in.

Activations: a forward pass (and loss) of the run's largest example records the tensors autograd
keeps for the backward pass (``torch.autograd.graph.saved_tensors_hooks``, each storage counted
once, parameters excluded); so does one of two copies of it. Their difference is what each example
adds; the rest (kernels, spectra, which do not grow with the batch) is kept once. Where two copies
would not fit, each example of the batch counts in full (an upper bound). Parameters: weights,
gradients and AdamW's two moments, four copies. The backward pass holds temporaries beside the
saved tensors (gradients of activations, FFT buffers): ``BACKWARD_MARGIN`` covers them, measured on
this project's models (docs/training.md, "Memory").
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch

BACKWARD_MARGIN = 2.0
GB = 1 << 30


@dataclass
class MemoryEstimate:
    """Bytes a training step needs beyond what the process holds before it (the data, the libraries)."""

    parameters: int  # weights, gradients and the optimizer's two moments
    activations: int  # what autograd keeps for the backward pass of one batch, with the backward's margin
    held: int | None = None  # what the process held when estimated (CPU: resident set; GPU: allocated), None if unknown

    @property
    def total(self) -> int:
        return self.parameters + self.activations

    @property
    def peak(self) -> int | None:
        """The expected high-water mark: what is held plus what a step adds."""
        return None if self.held is None else self.held + self.total

    def describe(self) -> str:
        return (
            f"{self.total / GB:.2f} GB ({self.parameters / GB:.2f} GB of weights, gradients and optimizer state, "
            f"{self.activations / GB:.2f} GB of activations)"
        )


def saved_tensor_bytes(run, exclude: set[int]) -> int:
    """Bytes of the distinct storages autograd saves for backward while ``run()`` executes, but those in ``exclude``."""
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in exclude:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return sum(storages.values())


def estimate_training_memory(model, loss_of, batch_size: int, device) -> MemoryEstimate:
    """The estimate for a batch of ``batch_size``; ``loss_of(copies)`` computes the loss of ``copies``
    copies of the run's largest example the way a training step does (see the module docstring)."""
    parameters = list(model.parameters())
    weights = sum(p.numel() * p.element_size() for p in parameters)
    exclude = {p.untyped_storage().data_ptr() for p in parameters}
    was_training = model.training
    model.train()

    def saved(copies: int) -> int:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):  # dropout leaves the run's RNG alone
            return saved_tensor_bytes(lambda: loss_of(copies), exclude)

    available = available_memory(device)
    try:
        one = saved(1)
        if batch_size == 1:
            activations = one
        elif available is not None and BACKWARD_MARGIN * 2 * one > available:
            activations = batch_size * one  # two copies might not fit: the upper bound, with nothing shared
        else:
            two = saved(2)  # some saved tensors (kernels, spectra) do not grow with the batch
            activations = max(one, 2 * one - two + batch_size * (two - one))
    finally:
        model.train(was_training)
    return MemoryEstimate(parameters=4 * weights, activations=int(BACKWARD_MARGIN * activations), held=held_memory(device))


def held_memory(device: torch.device) -> int | None:
    """Bytes this process holds now on ``device``: the CUDA allocator's, or the resident set."""
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else resident_memory()


def resident_memory() -> int | None:
    """Bytes this process holds now (Linux VmRSS), None where it cannot be read."""
    try:
        with open("/proc/self/status") as file:
            return next(int(line.split()[1]) * 1024 for line in file if line.startswith("VmRSS:"))
    except (OSError, StopIteration, ValueError):
        return None


def peak_memory(device: torch.device) -> int | None:
    """Bytes at this process's high-water mark: the most the CUDA allocator held, or the peak resident set
    (``resident_peak``; where /proc has none, ``getrusage``: kilobytes on Linux, bytes on macOS); None where
    neither can be read."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    peak = resident_peak()
    if peak is not None:
        return peak
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def resident_peak(pid: int | str = "self") -> int | None:
    """The high-water mark of process ``pid``'s resident memory in bytes (``VmHWM`` in /proc, Linux), None where
    /proc has none. Not ``ru_maxrss``: Linux carries that over an exec from the process that forked this one, so
    a process started by a larger one would report the larger one's peak."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return next((int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:")), None)
    except (OSError, ValueError):
        return None


def reset_resident_peak() -> bool:
    """Lower this process's ``VmHWM`` to its present resident size (Linux: 5 written to /proc/self/clear_refs);
    False where that cannot be done."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        return False
    return True


def describe_memory(estimate: MemoryEstimate, device: torch.device) -> str:
    """One line: what the process holds, what a training step adds, what is available."""
    held, available = estimate.held, available_memory(device)
    parts = [] if held is None else [f"the process holds {held / GB:.2f} GB"]
    parts.append(f"a training step adds about {estimate.describe()}")
    if available is not None:
        parts.append(f"{available / GB:.2f} GB available")
    return "memory: " + "; ".join(parts)


def available_memory(device: torch.device) -> int | None:
    """Bytes free for this process: the GPU's free memory, or the system's available memory (Linux), shared
    by the processes of one node (torchrun's LOCAL_WORLD_SIZE); None where it cannot be read."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as file:
            fields = dict(line.split(":", 1) for line in file)
        available = int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None
    return available // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def check_memory_fits(estimate: MemoryEstimate, device: torch.device) -> None:
    """ValueError with the estimate and what to lower when it exceeds the memory ``device`` has free."""
    available = available_memory(device)
    if available is not None and estimate.total > available:
        raise ValueError(
            f"training needs about {estimate.describe()}, more than the {available / GB:.2f} GB available on {device}: "
            "lower --batch-size (activations grow with it), --seq-len, --dim or --depth, or pass --no-memory-check to try anyway"
        )
