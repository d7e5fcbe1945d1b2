#!/usr/bin/env bash
# The GPU checks gpu.md still lacks, as one script for a lent GPU (an H100 or H200): the CUDA tests of the fused
# Toeplitz kernels and of graph-captured decoding, then the benchmarks of gpu.md's "Still to measure", most wanted
# first. Run from the repository root with the Python of PYTHON (default python3) that has torch, triton and pytest:
# the source tree goes on PYTHONPATH, nothing is installed. Each step runs within what is left of BUDGET_S seconds (default 540); a step with no time left is
# skipped and named in skipped.txt, to be run by a second call with ONLY="name ...". The logs and JSON files go to
# WORK (default /tmp/gpu_checks), packed after every step into $OUT/gpu_checks.tgz (default OUT: /tmp/gpu_checks_out),
# so a run stopped at its limit still brings back what it measured. A failing step does not stop the others.
set -u
work="${WORK:-/tmp/gpu_checks}"
out="${OUT:-/tmp/gpu_checks_out}"
deadline=$(($(date +%s) + ${BUDGET_S:-540}))
only=" ${ONLY:-} "
python="${PYTHON:-python3}"
mkdir -p "$work" "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
status=0

pack() { tar czf "$out/gpu_checks.tgz.part" -C "$work" . && mv "$out/gpu_checks.tgz.part" "$out/gpu_checks.tgz"; }

step() {  # step NAME COMMAND...: run it within the time left (SIGINT first: pytest and bench write what they have)
    local name=$1 left=$((deadline - $(date +%s)))
    shift
    [ "$only" = "  " ] || [[ "$only" == *" $name "* ]] || return 0
    if [ "$left" -lt 45 ]; then
        echo "== $name skipped: ${left}s left"
        echo "$name" >> "$work/skipped.txt"
        status=1
        return 0
    fi
    echo "== $name (${left}s left): $*"
    timeout -s INT -k 15 "$left" "$@" > "$work/$name.log" 2>&1
    local code=$?
    tail -n 25 "$work/$name.log"
    [ "$code" -eq 0 ] || { echo "== $name failed ($code)"; status=1; }
    pack
}

bench() { step "$1" "$python" -m tokenmix.cli bench --device cuda --repeats 10 --output "$work/$1.json" "${@:2}"; }

{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; "$python" -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)"; } > "$work/gpu.txt" 2>&1
cat "$work/gpu.txt"
pack

# 1. CUDA tests: the fused kernels compiled (not interpreted) against naive and PyTorch's path; CUDA graphs of the
#    static step against the eager static step; generation and the serve engine with graphs against the stream's tokens.
step tests "$python" -m pytest -q -n 4 -p no:cacheprovider tests/ops/test_op_forms.py tests/mixers/test_mixer_tno.py tests/test_cuda.py \
    -k "fused or proved or cuda_graph or generation_on_the_device or engine_serves"

# 2. The tno mixer against the FFT floor at 4096 and 65536 tokens per batch, bf16, with the fused products: compiled with
#    CUDA graphs (the fused kernels are custom operators inside the graph), then eager and profiled (the kernels, and how
#    busy they keep the device: busy_ms); then PyTorch's products the same two ways, for the ratios within this run.
for kernels in fused torch; do
    bench "tno_bf16_cudagraphs_$kernels" --causal yes --kinds mixer --mixers tno --lengths 512,65536 --precision bf16 --compile \
        --compile-mode reduce-overhead --kernels "$kernels"
    bench "tno_bf16_eager_$kernels" --causal yes --kinds mixer --mixers tno --lengths 512,65536 --precision bf16 --kernels "$kernels" \
        --profile
done

# 3. One-token decoding at batch 1: the stream's step against the CUDA graph of the static step (static_speedup).
bench generate_graphs --kinds generate --generate-batch 1 --model-dim 512 \
    --models tnn,fd_tnn,ski_tnn,mega,tcnca,transformer,fnet_ar_xl,transformer_xl \
    --lengths 256,4096 --mixers tno --stream-lengths 1024

# 4. The papers' models against the Transformer, width 512, depth 6, 16384 tokens per step, bf16 compiled, fused kernels;
#    with the kernels that take each step's time and how busy they keep the device (--profile: busy_ms).
bench models_bf16_compiled_fused --causal yes --kinds model --model-dim 512 --depth 6 --batch-tokens 16384 \
    --models tnn,fd_tnn,ski_tnn,transformer --lengths 2048,16384 --precision bf16 --compile --kernels fused --profile

echo "== done; the logs and results in $work, packed in $out/gpu_checks.tgz"
exit $status
