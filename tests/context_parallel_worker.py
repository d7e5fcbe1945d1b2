"""Run under torchrun (gloo): every registered model and task, split over all the processes by context
parallelism and then over processes 0 and 1 alone, against the same model in one process. Rank 0 writes
{number of processes: one JSON record per (model, task, dtype)}."""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

import tokenmix
from tokenmix.mixers.parts import leaf_names
from tokenmix.models.registry import model_spec
from tokenmix.parallel import ContextShard, context_parallel_logits, context_parallel_problems

LENGTH = 23  # divisible by neither 2 nor 4
SMALL = {"chunk_size": 5, "z_dim": 4, "rpe_dim": 8, "rpe_layers": 1, "kernel_size": 3, "rank": 6, "filter_size": 5}
SMALL |= {"memory_length": 30, "fourier.window": 8}  # XL: a memory longer than a segment, shorter than two (FNetAR: its DFT window)


def small_options(name: str) -> dict:
    """Options of ``name`` small enough to run fast, with chunks and receptive fields across shard boundaries."""
    accepted = set(leaf_names(tokenmix.models.registry.resolve_model_options(name, {}, 8, 2)))
    return {key: value for key, value in SMALL.items() if key in accepted}


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max().detach() / want.abs().max().detach().clamp_min(1e-30))


# Models with a mixer other than their default, under a name of their own: (model, its options, their tasks).
BIDIRECTIONAL = ("mlm", "classify")
VARIANTS = {
    "tnn+fnet": ("tnn", {"mixer": "fnet"}, BIDIRECTIONAL),
    "tnn+fnet_sequence_only": ("tnn", {"mixer": "fnet", "mixer.sequence_only": True}, BIDIRECTIONAL),
    # heads that 2 and 4 processes cannot share: ring attention (rotary, learned bias; MEGA's one head, value width 2 z)
    "transformer+one_head": ("transformer", {"heads": 1}, model_spec("transformer").tasks),
    "transformer+one_head_bias": ("transformer", {"heads": 1, "position": "bias"}, model_spec("transformer").tasks),
    "mega+full_attention": ("mega", {"chunk_size": None, "z_dim": 4}, model_spec("mega").tasks),
}


def tasks_of(name: str) -> tuple[str, ...]:
    """The tasks a registered model or a variant has."""
    return VARIANTS[name][2] if name in VARIANTS else model_spec(name).tasks


def compare(name: str, task: str, dtype: torch.dtype, group) -> dict:
    torch.manual_seed(0)
    # classification pools the mean (first or last would leave some weights a gradient of rounding noise alone)
    head = {"num_classes": 3, "pool": "mean"} if task == "classify" else {}
    name, options = VARIANTS[name][:2] if name in VARIANTS else (name, small_options(name))
    model = tokenmix.build_model(name, task=task, vocab_size=20, dim=8, depth=2, dropout=0.0, **head, **options).to(dtype)
    processes = dist.get_world_size(group)
    problems = context_parallel_problems(model, processes)
    if problems:
        return {"problems": problems}
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 20, (2, LENGTH), generator=generator)
    targets = torch.randint(0, 20, (2, LENGTH), generator=generator)
    mask = torch.ones(2, LENGTH, dtype=torch.bool)
    mask[0, :3] = False  # padding on the left of one row, on the right of the other
    mask[1, -6:] = False
    real = mask.sum()

    def loss_of(logits, span) -> torch.Tensor:
        """The share of the batch's loss that positions ``span`` carry (classification: the loss over
        the processes, every one of which holds the whole batch's class logits)."""
        if task == "classify":
            return torch.nn.functional.cross_entropy(logits, targets[:, 0] % 3) / (1 if span == slice(None) else processes)
        chosen = mask[:, span]
        return torch.nn.functional.cross_entropy(logits[chosen], targets[:, span][chosen], reduction="sum") / real

    logits = model(tokens, mask)
    loss_of(logits, slice(None)).backward()
    expected = {key: parameter.grad.clone() for key, parameter in model.named_parameters() if parameter.grad is not None}
    model.zero_grad()

    shard = ContextShard(group, dist.get_rank(group), processes, LENGTH)
    span = slice(shard.start, shard.stop)
    local = context_parallel_logits(model, tokens[:, span], mask, shard, tokens_given_whole=False)  # as a training step reads
    local_loss = loss_of(local, span)
    local_loss.backward()
    if task == "classify":
        errors = {"logits": relative_error(local, logits)}
    else:
        errors = {"logits": relative_error(local[mask[:, span]], logits[:, span][mask[:, span]])}
    grads = {key: torch.zeros_like(parameter) if parameter.grad is None else parameter.grad for key, parameter in model.named_parameters()}
    loss, *summed = summed_over(group, [local_loss.detach(), *grads.values()])  # one collective per comparison
    errors["loss"] = relative_error(loss, loss_of(logits, slice(None)).detach())
    gradient_errors = {key: relative_error(grad, expected.get(key, 0 * grad)) for key, grad in zip(grads, summed, strict=True)}
    errors["gradients"] = max(gradient_errors.values())
    worst = max(gradient_errors, key=gradient_errors.get)
    if task == "lm" and dtype == torch.float64:  # tokens of the last shard changed: the logits of every earlier shard stay exactly
        changed = tokens.clone()
        changed[:, shard.bounds[-1][0] :] = (changed[:, shard.bounds[-1][0] :] + 1) % 20
        with torch.no_grad():
            moved = context_parallel_logits(model, changed[:, span], mask, shard, tokens_given_whole=False)
        errors["earlier_shards_moved"] = float((moved - local.detach()).abs().max()) if shard.rank < shard.size - 1 else 0.0
    if model.recurrent:
        errors |= stream_errors(model, tokens, targets, shard)
    worst_of_all = torch.tensor(list(errors.values()), dtype=torch.float64)
    dist.all_reduce(worst_of_all, op=dist.ReduceOp.MAX, group=group)
    return {**dict(zip(errors, worst_of_all.tolist(), strict=True)), "worst_gradient": worst}


def summed_over(group, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each tensor summed over the processes of ``group``, by one all-reduce of them all flattened
    (a collective per parameter cost each comparison dozens of rounds among oversubscribed processes)."""
    flat = torch.cat([tensor.detach().reshape(-1) for tensor in tensors])
    dist.all_reduce(flat, group=group)
    return [part.view_as(tensor) for part, tensor in zip(flat.split([tensor.numel() for tensor in tensors]), tensors, strict=True)]


def stream_errors(model, tokens: torch.Tensor, targets: torch.Tensor, shard: ContextShard) -> dict:
    """A segment-recurrent model (Transformer-XL) streams two segments, memory carried: the second
    segment's logits, loss and gradients and every layer's memory after it, split against one process."""
    model = model.with_options(segment_length=LENGTH)
    segments = (tokens.flip(-1), tokens)

    def second_segment(forward):
        with torch.no_grad():
            _, state = forward(segments[0], model.init_state(tokens.shape[0]))
        return forward(segments[1], state)

    logits, after = second_segment(lambda x, state: model(x, state=state, return_state=True))
    total = targets.numel()
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum").div(total).backward()
    expected = {key: parameter.grad.clone() for key, parameter in model.named_parameters()}
    model.zero_grad()
    span = slice(shard.start, shard.stop)  # the shard's tokens alone, as a training step reads them
    local, split_after = second_segment(lambda x, state: context_parallel_logits(model, x[:, span], None, shard, state, True, False))
    torch.nn.functional.cross_entropy(local.flatten(0, 1), targets[:, span].flatten(), reduction="sum").div(total).backward()
    named = dict(model.named_parameters())
    summed = summed_over(shard.group, [parameter.grad for parameter in named.values()])
    gradient_errors = [relative_error(grad, expected[key]) for key, grad in zip(named, summed, strict=True)]
    memories = [relative_error(split.memory, whole.memory) for split, whole in zip(split_after.blocks, after.blocks, strict=True)]
    return {
        "stream_logits": relative_error(local.detach(), logits[:, span].detach()),
        "stream_gradients": max(gradient_errors),
        "stream_memory": max(memories),
        "stream_memory_length": min(block.memory.shape[1] for block in split_after.blocks),
    }


def release_waiting(size: int) -> None:
    """The processes beyond the first ``size`` wait until those are done, in a blocking receive from process 0
    (gloo's barrier would keep their cores busy while the others compare)."""
    token = torch.zeros(1)
    if dist.get_rank() == 0:
        for waiting in range(size, dist.get_world_size()):
            dist.send(token, waiting)
    elif dist.get_rank() >= size:
        dist.recv(token, 0)


def main(output: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    groups = {dist.get_world_size(): dist.group.WORLD, 2: dist.new_group([0, 1])}  # every process joins each new group
    records = {}
    for size, group in groups.items():
        if rank < size:
            records[size] = []
            for name in [*tokenmix.list_models(), *VARIANTS]:
                for task in [task for task in ("lm", "mlm", "classify") if task in tasks_of(name)]:
                    for dtype in (torch.float64, torch.float32):
                        records[size].append({"model": name, "task": task, "dtype": str(dtype), **compare(name, task, dtype, group)})
        release_waiting(size)
    if rank == 0:
        with open(output, "w") as file:
            json.dump(records, file, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
    # The records are written. Skip the interpreter's shutdown: PyTorch 2.13 keeps the process group (and
    # gloo's worker threads) alive past destroy_process_group once a checkpoint or functional collective
    # has used it, and a worker thread releasing the barrier's finished work while the interpreter shuts
    # down aborts the process now and then (pytorch/pytorch#190489: a decref takes the GIL during finalization).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
