#!/usr/bin/env bash
# The GPU checks gpu.md still lacks, as one script for a lent GPU (an H100 or H200): the CUDA tests of the fused
# Toeplitz kernels and of graph-captured decoding, then the benchmarks of gpu.md's "Still to measure", most wanted
# first. Run from the repository root with the Python of PYTHON (default python3) that has torch, triton, pytest and
# pytest-xdist: the source tree goes on PYTHONPATH, nothing is installed.
#
# Each step runs within what is left of BUDGET_S seconds (default 540), and the tests within TESTS_S (default 240);
# a step with no time left, or stopped at its limit (SIGINT first: pytest and bench write what they have), is named in
# skipped.txt, to be run by a second call with ONLY="the names". The logs and JSON files go to WORK (default
# /tmp/gpu_checks), packed after every step into $OUT/gpu_checks.tgz (default OUT: /tmp/gpu_checks_out), so a run
# stopped at its limit still brings back what it measured. A failing step does not stop the others.
set -u
work="${WORK:-/tmp/gpu_checks}"
out="${OUT:-/tmp/gpu_checks_out}"
deadline=$(($(date +%s) + ${BUDGET_S:-540}))
only=" $(echo ${ONLY:-}) "  # the names, whitespace of any kind between them
python="${PYTHON:-python3}"
mkdir -p "$work" "$out"
rm -f "$work/skipped.txt"  # this call's
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
status=0
steps=" "  # every step's name, to check ONLY's against

pack() {  # GNU tar exits 1 when a file changed while it was read (a killed step's last lines): the archive is still made
    tar czf "$out/gpu_checks.tgz.part" --warning=no-file-changed -C "$work" .
    [ $? -le 1 ] && mv "$out/gpu_checks.tgz.part" "$out/gpu_checks.tgz"
}

skipped() {  # skipped NAME WHY
    echo "== $1 $2: run it again with ONLY"
    echo "$1" >> "$work/skipped.txt"
    status=1
}

step() {  # step NAME COMMAND...: run it within the time left, at most STEP_S seconds when set
    local name=$1 left=$((deadline - $(date +%s)))
    shift
    steps+="$name "
    [ "$only" = "  " ] || [[ "$only" == *" $name "* ]] || return 0
    [ "$left" -ge 45 ] || { skipped "$name" "skipped (${left}s left)"; return 0; }
    local limit=$((${STEP_S:-$left} < left ? ${STEP_S:-$left} : left))
    echo "== $name (${limit}s at most): $*"
    timeout -s INT -k 15 "$limit" "$@" > "$work/$name.log" 2>&1
    local code=$?
    tail -n 25 "$work/$name.log"
    case $code in
        0) ;;
        124 | 137) skipped "$name" "stopped at its limit of ${limit}s (its results so far are kept)" ;;
        *) echo "== $name failed ($code)"; status=1 ;;
    esac
    pack
}

bench() { step "$1" "$python" -m tokenmix.cli bench --device cuda --repeats 10 --output "$work/$1.json" "${@:2}"; }

{
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    "$python" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
    "$python" -c "from tokenmix.version import source_revision; print('tokenmix source', source_revision())"
    "$python" -c "import xdist, hypothesis, prometheus_client" || echo "missing test dependencies: the tests step fails or skips"
} > "$work/gpu.txt" 2>&1
cat "$work/gpu.txt"
pack

# 1. CUDA tests: the fused kernels (the factored products, the static step's history product) compiled (not interpreted)
#    against naive and PyTorch's path; CUDA graphs of the static step against the eager static step; generation and the
#    serve engine with graphs against the stream's tokens.
STEP_S="${TESTS_S:-240}" step tests "$python" -m pytest -q -n 4 -p no:cacheprovider tests/ops/test_op_forms.py tests/mixers/test_mixer_tno.py tests/test_cuda.py \
    tests/ops/test_history_toeplitz.py tests/generation/test_static_decoding.py \
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

# 5. Step 3's TNN with PyTorch's static step (the taps gathered over the whole buffer) instead of the fused history
#    kernel (auto, above), for the ratio within one session.
bench generate_graphs_torch --kinds generate --generate-batch 1 --model-dim 512 --models tnn --lengths 256,4096 \
    --stream-lengths 1024 --kernels torch

for name in $only; do
    [[ "$steps" == *" $name "* ]] || { echo "== ONLY names no step: $name (the steps:$steps)"; status=2; }
done
echo "== done; the logs and results in $work, packed in $out/gpu_checks.tgz"
exit $status
