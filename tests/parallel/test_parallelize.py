"""``tokenmix.parallel.parallelize`` in one process: the steps apply in torchtitan's order, the caller's
check runs on the eager, whole model, and ``ParallelDims`` of one process makes every collective the value
itself. (Under torchrun: test_fsdp.py, test_context_parallel.py, test_train.py's DDP run.)"""

import torch

import tokenmix
from tokenmix.parallel.dims import ParallelDims, init_distributed
from tokenmix.parallel.parallelize import ParallelConfig, parallelize


def small_model():
    return tokenmix.build_model("tnn", vocab_size=8, dim=8, depth=2)


def test_one_process_is_the_model_itself_with_checkpointing_applied():
    model = small_model()
    parallel = parallelize(model, ParallelDims(), ParallelConfig(activation_checkpointing=True))
    assert parallel.model is parallel.trained is parallel.evaluated is model and parallel.split is None
    assert model.activation_checkpointing


def test_the_callers_check_sees_the_eager_model_and_compile_comes_after_it():
    """Fails if blocks are compiled before ``before_wrapping`` runs (the memory probe would compile its batch sizes)."""
    model, seen = small_model(), []

    def check(split):
        seen.append((split, [hasattr(block.forward, "_torchdynamo_orig_callable") for block in model.blocks]))

    parallelize(model, ParallelDims(), ParallelConfig(compile=True), check)
    assert seen == [(None, [False, False])]
    assert all(hasattr(block.forward, "_torchdynamo_orig_callable") for block in model.blocks)


def test_dims_of_one_process(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    dims = init_distributed(torch.device("cpu"))
    assert (dims.world_size, dims.rank, dims.dp, dims.cp, dims.data_rank, dims.context_group) == (1, 0, 1, 1, 0, None)
    assert dims.is_main and not dims.enabled and dims.shard_mesh is None
    assert dims.all_reduce_mean(2.5) == 2.5 and dims.all_reduce_max([1.0, 3.0]) == [1.0, 3.0]
    assert dims.agree(True, False) == [True, False] and dims.gather_objects("x") == ["x"]
    dims.barrier()
    dims.close()
