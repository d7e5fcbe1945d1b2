"""tokenmix works without its optional extras, and says how to get them."""

import subprocess
import sys

WITHOUT_TRANSFORMERS = "import sys\nsys.modules['transformers'] = None  # as if it were not installed\n"


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_TRANSFORMERS + code], capture_output=True, text=True)


def test_tokenmix_imports_trains_and_explains_the_hf_extra_without_transformers(tmp_path):
    (tmp_path / "run").mkdir()
    result = run(
        "import tokenmix, tokenmix.cli\n"
        "model = tokenmix.build_model('tnn', vocab_size=20, dim=8, depth=1)\n"
        "try:\n    import tokenmix.hf\nexcept ImportError as error:\n    print('hf:', error)\n"
        f"tokenmix.cli.main(['export-hf', {str(tmp_path / 'run')!r}, {str(tmp_path / 'out')!r}])\n"
    )
    assert 'hf: tokenmix.hf needs Hugging Face transformers: pip install "tokenmix[hf]"' in result.stdout
    assert result.returncode == 2 and 'error: tokenmix.hf needs Hugging Face transformers: pip install "tokenmix[hf]"' in result.stderr


def test_serve_explains_its_extra_without_fastapi(tiny_runs):
    code = "import sys\nsys.modules['fastapi'] = None  # as if it were not installed\nimport tokenmix.cli\n"
    code += f"tokenmix.cli.main(['serve', {str(tiny_runs['lm'])!r}])\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and 'error: tokenmix serve needs its optional extra: pip install "tokenmix[serve]"' in result.stderr
    code = code.replace(f"['serve', {str(tiny_runs['lm'])!r}]", "['bench', '--kinds', 'serve']")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and 'error: bench --kinds serve needs its optional extra: pip install "tokenmix[serve]"' in result.stderr


def test_the_toeplitz_mixers_train_without_triton_and_the_fused_kernels_name_their_extra():
    code = (
        "import sys\nsys.modules['triton'] = None  # as if it were not installed\n"
        "import torch, tokenmix\nfrom tokenmix.ops.fused_toeplitz import kernels\n"
        "mixer = tokenmix.build_mixer('tno', 4)\nmixer(torch.randn(2, 8, 4)).sum().backward()\n"
        "try:\n    with kernels('fused'):\n        mixer(torch.randn(2, 8, 4))\nexcept ValueError as error:\n    print('fused:', error)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "fused: the fused kernels need Triton: pip install 'tokenmix[fused]'" in result.stdout
