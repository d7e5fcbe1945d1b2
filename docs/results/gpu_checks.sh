#!/usr/bin/env bash
# The GPU checks gpu.md still lacks, as one script for a lent GPU (about 10 minutes on an H100 or H200):
# the CUDA tests of the fused Toeplitz kernels and of graph-captured decoding, then the benchmarks of
# gpu.md's "Still to measure". Run from the repository root with the project installed (its `fused` extra
# included); every output lands in $OUT (default /tmp/gpu_checks), a failing step does not stop the others.
set -u
out="${OUT:-/tmp/gpu_checks}"
mkdir -p "$out"
status=0

step() {  # step NAME COMMAND...: run it, its output in $out/NAME.log, its status remembered
    local name=$1
    shift
    echo "== $name: $*"
    "$@" > "$out/$name.log" 2>&1
    local code=$?
    tail -n 25 "$out/$name.log"
    [ "$code" -eq 0 ] || { echo "== $name failed ($code)"; status=1; }
}

bench() { step "$1" tokenmix bench --device cuda --repeats 10 --output "$out/$1.json" "${@:2}"; }

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$out/gpu.txt" 2>&1
python -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)" >> "$out/gpu.txt" 2>&1
cat "$out/gpu.txt"

# 1. CUDA tests: the fused kernels compiled (not interpreted) against naive and PyTorch's path; CUDA graphs of the
#    static step against the eager static step; generation and the serve engine with graphs against the stream's tokens.
step tests python -m pytest -q -n 4 tests/ops/test_op_forms.py tests/mixers/test_mixer_tno.py tests/test_cuda.py \
    -k "fused or proved or cuda_graph or generation_on_the_device or engine_serves"

# 2. The tno mixer against the FFT floor at 4096 and 65536 tokens per batch, bf16, with PyTorch's products and with the
#    fused ones: eager (profiled: the kernels and the device's busy time), then compiled with CUDA graphs (the fused
#    kernels are custom operators inside the graph).
for kernels in torch fused; do
    bench "tno_bf16_eager_$kernels" --causal yes --kinds mixer --mixers tno --lengths 512,65536 --precision bf16 --kernels "$kernels" \
        --profile
    bench "tno_bf16_cudagraphs_$kernels" --causal yes --kinds mixer --mixers tno --lengths 512,65536 --precision bf16 --compile \
        --compile-mode reduce-overhead --kernels "$kernels"
done

# 3. The papers' models against the Transformer, width 512, depth 6, 16384 tokens per step, bf16 compiled, fused kernels;
#    with the kernels that take each step's time and how busy they keep the device (--profile: busy_ms).
bench models_bf16_compiled_fused --causal yes --kinds model --model-dim 512 --depth 6 --batch-tokens 16384 \
    --models tnn,fd_tnn,ski_tnn,transformer --lengths 2048,16384 --precision bf16 --compile --kernels fused --profile

# 4. One-token decoding at batch 1: the stream's step against the CUDA graph of the static step (static_speedup).
bench generate_graphs --kinds generate --generate-batch 1 --model-dim 512 \
    --models tnn,fd_tnn,ski_tnn,mega,tcnca,transformer,fnet_ar_xl,transformer_xl \
    --lengths 256,4096 --mixers tno --stream-lengths 1024

echo "== done; outputs in $out"
exit $status
