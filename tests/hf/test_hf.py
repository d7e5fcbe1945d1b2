"""The Hugging Face layer: Auto classes, generate() on the streaming state, export and load.

Skipped when transformers is not installed (`pip install "tokenmix[hf]"`); CI installs it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers", reason='the Hugging Face layer needs transformers: pip install "tokenmix[hf]"')

from conftest import relative_error  # noqa: E402
from test_contracts import LM_MODELS  # noqa: E402
from transformers import (  # noqa: E402
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
)

import tokenmix  # noqa: E402
import tokenmix.hf  # noqa: E402
from tokenmix.cli import main  # noqa: E402
from tokenmix.data.tokenizer import byte_tokenizer, train_bpe  # noqa: E402
from tokenmix.models.registry import resolve_model_options  # noqa: E402

PROMPT_LENGTHS = (3, 11, 1)


SEGMENT = 8  # XL models stream in segments of 8 tokens, so prompts and generations cross several
DISTILLED = "tnn (distilled)"  # a TNN whose Toeplitz mixers are state spaces, as `tokenmix distil` writes it
CAUSAL_MODELS = [*LM_MODELS, DISTILLED]


def small(name: str, task: str = "lm", **extra):
    """A small model; chunked attention (where the model has it) in chunks of 8 tokens, so that
    padding that shifted positions would move chunk boundaries; XL models in segments of 8."""
    torch.manual_seed(0)
    if name == DISTILLED:
        name, extra = "tnn", {"mixer": "ssm", "order": 4, "window": 2, **extra}
    takes = resolve_model_options(name, {}, dim=16, depth=2)
    if "chunk_size" in takes:
        extra.setdefault("chunk_size", 8)
    if "segment_length" in takes:
        extra.setdefault("segment_length", SEGMENT)
    return tokenmix.build_model(name, task=task, vocab_size=20, dim=16, depth=2, **extra).eval()


def exported(model, directory, dtype=torch.float32):
    """``model`` written with ``tokenmix.hf.export`` and read back with ``AutoModelForCausalLM``."""
    tokenmix.hf.export(model, directory)
    return AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).eval()


def left_padded(prompts: list[torch.Tensor], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(prompt) for prompt in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :], mask[row, width - len(prompt) :] = prompt, 1
    return ids, mask


def streamed_logits(model, tokens: torch.Tensor, horizon: int) -> torch.Tensor:
    """A single row's logits (length, vocab) through tokenmix's streaming state, as generation reads it."""
    state = model.init_state(1, max_length=horizon)
    with torch.no_grad():
        return model(tokens[None], state=state, return_state=True)[0][0]


@pytest.mark.parametrize("name", CAUSAL_MODELS)
def test_causal_lm_logits_equal_tokenmix_logits_and_left_padding_is_not_read(name, tmp_path):
    model = small(name)
    loaded = exported(model, tmp_path)
    assert type(loaded).__name__ == "TokenmixForCausalLM"
    tokens = torch.randint(0, 20, (2, 30), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 30, dtype=torch.long)
    mask[1, :7] = 0
    with torch.no_grad():
        assert relative_error(loaded(tokens, use_cache=False).logits, model(tokens)) <= 1e-6
        # without a cache: each row group is one forward of its real tokens; with one: a stream over the input's horizon
        alone = {False: lambda row: model(row[None])[0], True: lambda row: streamed_logits(model, row, 30)}
        for use_cache, reference in alone.items():
            logits = loaded(tokens, attention_mask=mask, use_cache=use_cache).logits
            assert relative_error(logits[0], reference(tokens[0])) <= 1e-5
            assert relative_error(logits[1, 7:], reference(tokens[1, 7:])) <= 1e-5  # the row read alone, without its padding
            assert torch.equal(logits[1, :7], torch.zeros_like(logits[1, :7]))


@pytest.mark.parametrize("name", CAUSAL_MODELS)
def test_greedy_generate_of_left_padded_prompts_equals_tokenmix_generate(name, tmp_path):
    model = small(name).double()
    loaded = exported(model, tmp_path, torch.float64)
    prompts = [torch.randint(0, 20, (size,), generator=torch.Generator().manual_seed(size)) for size in PROMPT_LENGTHS]
    ids, mask = left_padded(prompts)
    options = {"do_sample": False, "max_new_tokens": 50, "pad_token_id": 0, "return_dict_in_generate": True, "output_logits": True}
    out = loaded.generate(ids, attention_mask=mask, **options)
    expected = tokenmix.generate(model, prompts, 50, temperature=0)
    horizon = ids.shape[1] + 50
    assert out.past_key_values.max_length == horizon  # the horizon tokenmix.generate plans for
    assert len(out.past_key_values.layer_states) == len(model.blocks)  # one entry per block
    assert out.past_key_values.get_seq_length() == horizon - 1  # every token but the last was read
    for row, (prompt, new) in enumerate(zip(prompts, expected, strict=True)):
        assert torch.equal(out.sequences[row, ids.shape[1] :], new), row
        reference = streamed_logits(model, torch.cat([prompt, new]), horizon)[len(prompt) - 1 : -1]
        steps = torch.stack([step[row] for step in out.logits])
        assert relative_error(steps.double(), reference) <= 1e-6, row  # each step's logits (kept in float32), not only the argmax


@pytest.mark.parametrize("name", ["tnn", "mega", "transformer_xl"])
def test_beam_search_with_the_cache_equals_it_without(name, tmp_path):
    loaded = exported(small(name).double(), tmp_path, torch.float64)
    ids, mask = left_padded([torch.tensor([3, 4, 5, 6]), torch.tensor([7, 8])])
    options = {"attention_mask": mask, "do_sample": False, "num_beams": 3, "num_return_sequences": 3, "max_new_tokens": 8}
    options.update(pad_token_id=0, return_dict_in_generate=True, output_scores=True)
    cached, recomputed = loaded.generate(ids, **options), loaded.generate(ids, use_cache=False, **options)
    assert cached.sequences.shape == (6, 12)  # three beams of each prompt
    assert torch.equal(cached.sequences, recomputed.sequences)
    assert torch.allclose(cached.sequences_scores, recomputed.sequences_scores, rtol=1e-9)


def test_export_reload_and_save_pretrained_keep_the_logits(tmp_path):
    model = small("tnn")
    tokenmix.hf.export(model, tmp_path / "export", byte_tokenizer())
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    assert config["model_type"] == "tokenmix" and config["tokenmix"] == json.loads(model.config.to_json())
    assert isinstance(AutoConfig.from_pretrained(tmp_path / "export"), tokenmix.hf.TokenmixConfig)
    tokens = torch.randint(0, 20, (2, 17))
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "export")
    loaded.save_pretrained(tmp_path / "again")
    with torch.no_grad():
        expected = model(tokens)
        for directory in ("export", "again"):
            assert torch.equal(AutoModelForCausalLM.from_pretrained(tmp_path / directory)(tokens, use_cache=False).logits, expected)
        assert torch.equal(tokenmix.open_run(tmp_path / "export").model(tokens), expected)  # tokenmix reads it too
        hidden = AutoModel.from_pretrained(tmp_path / "export")(tokens).last_hidden_state
        assert torch.equal(hidden, model.hidden_states(tokens)[0])
    with pytest.raises(ValueError, match="already exists and is not an empty folder"):
        tokenmix.hf.export(model, tmp_path / "export")


def test_masked_lm_and_a_classifier_from_it(tmp_path):
    model = small("tnn", task="mlm")
    tokenmix.hf.export(model, tmp_path)
    tokens = torch.randint(0, 20, (2, 12))
    labels = torch.full_like(tokens, -100)
    labels[:, 3] = tokens[:, 3]
    masked = AutoModelForMaskedLM.from_pretrained(tmp_path)
    with torch.no_grad():
        output, expected = masked(tokens, labels=labels), model(tokens)
    assert torch.equal(output.logits, expected)
    assert float(output.loss) == pytest.approx(float(torch.nn.functional.cross_entropy(expected[:, 3], tokens[:, 3])), rel=1e-5)
    classifier = AutoModelForSequenceClassification.from_pretrained(tmp_path, num_labels=3)
    assert torch.equal(classifier.tokenmix.embedding.weight, model.embedding.weight)  # the body is the masked LM's
    head = classifier.tokenmix.classifier.weight
    assert torch.isfinite(head).all() and 0 < float(head.detach().std()) < 0.1  # a new head, drawn as transformers draws heads
    result = classifier(tokens, attention_mask=torch.ones_like(tokens), labels=torch.tensor([0, 2]))
    assert result.logits.shape == (2, 3) and torch.isfinite(result.loss)
    classifier.save_pretrained(tmp_path / "classifier")  # the new head is saved as part of the model it is now
    with torch.no_grad():
        assert torch.equal(tokenmix.open_run(tmp_path / "classifier").model(tokens), classifier(tokens).logits)
        assert torch.equal(
            AutoModelForSequenceClassification.from_pretrained(tmp_path / "classifier")(tokens).logits, classifier(tokens).logits
        )


def test_a_byte_masked_lm_exports_its_mask_token(tmp_path):
    tokenmix.hf.export(tokenmix.build_model("tnn", task="mlm", vocab_size=257, dim=8, depth=1), tmp_path, byte_tokenizer())
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.mask_token == "<mask>" and loaded.mask_token_id == 256  # the id the byte masked LM was trained with
    assert loaded("a<mask>")["input_ids"] == [97, 256]
    assert tokenmix.Tokenizer.load(tmp_path).is_bytes and tokenmix.Tokenizer.load(tmp_path).mask_id == 256


def test_a_bpe_tokenizer_reads_back_through_auto_tokenizer(tmp_path):
    bpe = train_bpe(("the quick brown fox jumps over the lazy dog\n" * 30).encode(), 300)
    tokenmix.hf.export(tokenmix.build_model("tnn", vocab_size=bpe.vocab_size, dim=8, depth=1), tmp_path, bpe)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "the lazy fox, quickly"
    assert loaded(text)["input_ids"] == bpe.encode(text).tolist()
    assert (loaded.eos_token, loaded.pad_token, loaded.mask_token, loaded.padding_side) == ("</s>", "<pad>", "<mask>", "left")
    assert AutoModelForCausalLM.from_pretrained(tmp_path).config.eos_token_id == bpe.end_of_document_id


def test_a_two_step_trainer_run_lowers_the_loss(tmp_path):
    pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate (installed with tokenmix[hf])")
    from transformers import Trainer, TrainingArguments

    tokenmix.hf.export(small("tnn"), tmp_path / "model")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    tokens = torch.randint(0, 20, (4, 24), generator=torch.Generator().manual_seed(0))
    dataset = [{"input_ids": row, "attention_mask": torch.ones_like(row), "labels": row} for row in tokens]
    with torch.no_grad():
        before = float(model(tokens, labels=tokens).loss)
    arguments = TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=4, learning_rate=1e-2, use_cpu=True,
        report_to="none", save_strategy="no", disable_tqdm=True,
    )  # fmt: skip
    Trainer(model=model, args=arguments, train_dataset=dataset).train()
    with torch.no_grad():
        assert float(model.eval()(tokens, labels=tokens).loss) < before


def test_export_hf_command_and_a_fresh_process_generate_the_same_tokens(tiny_runs):
    """The session's tiny LM and its ``tokenmix export-hf`` folder (made by the command, not changed since)."""
    run, out = tiny_runs["lm"], tiny_runs["export"]
    from tokenmix.io.files import default_file_mode

    assert {path.name: path.stat().st_mode & 0o777 for path in out.iterdir()} == dict.fromkeys(
        [path.name for path in out.iterdir()], default_file_mode()
    )  # safetensors alone would write model.safetensors 0600
    opened = tokenmix.open_run(run)
    model, tokenizer = opened.model, opened.tokenizer
    expected = tokenmix.generate(model, [tokenizer.encode("To be").long()], 20, temperature=0)[0].tolist()
    script = (
        "import sys, json, tokenmix.hf\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        f"model, tok = AutoModelForCausalLM.from_pretrained({str(out)!r}), AutoTokenizer.from_pretrained({str(out)!r})\n"
        "ids = tok('To be', return_tensors='pt')['input_ids']\n"
        "print(json.dumps(model.generate(ids, do_sample=False, max_new_tokens=20)[0, ids.shape[1]:].tolist()))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env={"HF_HUB_OFFLINE": "1", "PATH": ""})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == expected


def test_generate_transformers_prints_what_tokenmix_generate_prints(tmp_path, text_file, capsys):
    run, out = tmp_path / "run", tmp_path / "hf"
    sizes = ["--dim", "16", "--depth", "1", "--seq-len", "32", "--batch-size", "2", "--steps", "3", "-o", "rpe_dim=4"]
    assert main(["train", "--data", text_file, "--tokenizer", "bpe:280", *sizes, "--out", str(run)]) == 0
    assert main(["export-hf", str(run), str(out)]) == 0
    capsys.readouterr()
    flags = ["--prompt", "To be", "--prompt", "or", "--temperature", "0", "--max-new-tokens", "15"]
    assert main(["generate", str(run), *flags]) == 0
    ours = capsys.readouterr()
    assert main(["generate", str(out), "--transformers", *flags]) == 0
    theirs = capsys.readouterr()
    assert theirs.out == ours.out and "transformers: 30 tokens in" in theirs.err and "tokenmix: 30 tokens in" in ours.err


def test_an_export_from_before_xl_models_recorded_their_segment_still_streams_in_it(tmp_path):
    """Such exports kept the segment beside the tokenmix config (``segment_length``); it reaches the model."""
    tokenmix.hf.export(small("transformer_xl"), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["tokenmix"]["options"]["segment_length"]
    (tmp_path / "config.json").write_text(json.dumps({**config, "segment_length": SEGMENT}))
    assert AutoModelForCausalLM.from_pretrained(tmp_path).tokenmix.config.options["segment_length"] == SEGMENT
    assert tokenmix.open_run(tmp_path).model.config.options["segment_length"] == SEGMENT
