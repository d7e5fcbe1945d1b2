"""``tokenmix generate``: text from a run (or a transformers export), streamed or checked against recomputation."""

from __future__ import annotations

import codecs
import sys
import time

import torch

from ..data.tokenizer import Tokenizer
from ..errors import user_input
from ..fields import Integer, Number, Text
from ..generation import StopRule, check_sampling, generate, naive_generate
from ..generation.graphs import use_static_decoding
from ..runs import open_run
from .common import (
    DEMO_PROMPT,
    RUN,
    add_decoding,
    add_kernels,
    add_precision,
    add_threads_and_device,
    escaped,
    kernels_of,
    printable,
    use_threads,
)


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("generate", help="sample text from a causal LM checkpoint (cached: one step per token)")
    parser.add_argument("checkpoint", type=RUN, help="a run directory, checkpoint.pt or model folder (--transformers: an export-hf folder)")
    parser.add_argument(
        "--prompt",
        action="append",
        type=Text("a prompt"),
        help="text a sample continues; repeat for several, decoded as one batch (default: the demo's 'ROMEO.')",
    )
    parser.add_argument("--max-new-tokens", type=Integer(0), default=200, help="tokens to add to each prompt, any number (default: 200)")
    parser.add_argument("--temperature", type=Number(0), default=0.8, help="sampling temperature; 0 is greedy (default: 0.8)")
    parser.add_argument("--top-k", type=Integer(0), default=40, help="sample among the k most likely tokens; 0 turns it off (default: 40)")
    parser.add_argument(
        "--top-p",
        type=Number(0, 1, open_minimum=True),
        help="sample among the most likely tokens that hold this probability, in (0, 1]",
    )
    parser.add_argument(
        "--stop", type=Text("a stop text"), help="text that ends a sample, kept at its end (\\n stands for a newline, \\t for a tab)"
    )
    parser.add_argument("--stream", action="store_true", help="print text as it is produced (several prompts: one after another)")
    parser.add_argument(
        "--seed", type=Integer(0), default=0, help="seed of the sampling: prompt i samples with the generator of (seed, i) (default: 0)"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="with --temperature 0: also decode by re-running the whole sequence per token, compare, time both",
    )
    parser.add_argument(
        "--transformers",
        action="store_true",
        help="CHECKPOINT is a folder written by `tokenmix export-hf`: generate with transformers' AutoModelForCausalLM (docs/hf.md)",
    )
    add_threads_and_device(parser)
    add_precision(parser)
    add_kernels(parser)
    add_decoding(parser)
    parser.set_defaults(handler=run_generate)


class TextStream:
    """Prints a sample's bytes as text as they arrive (a character split across tokens waits for its
    last byte), and nothing after the end of the stop text once it has come."""

    def __init__(self, stop: StopRule):
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.stop, self.sample, self.done = stop, b"", False

    def write(self, data: bytes, final: bool = False) -> None:
        sys.stdout.write(escaped(self.decoder.decode(data, final)))
        sys.stdout.flush()

    def write_sample(self, data: bytes) -> None:
        """Bytes of generated tokens: written up to the end of the stop text."""
        if self.done:
            return
        cut = self.stop.cut(self.sample + data)
        self.done = self.stop.text is not None and self.stop.text in cut
        self.write(cut[len(self.sample) :])
        self.sample = cut


def _speed(tokens: int, seconds: float) -> str:
    return f"{tokens} tokens in {seconds:.2f} s ({tokens / max(seconds, 1e-9):.1f} tokens/s)"


def run_transformers_generate(args) -> int:
    """``generate --transformers``: the exported folder through transformers' Auto classes alone."""
    with user_input():
        use_threads(args)
        try:
            from ..hf.export import check_export
            from ..hf.sampling import transformers_generate
        except ImportError as error:
            raise ValueError(str(error)) from None
        if args.stop or args.stream or args.check or args.precision != "fp32" or args.decoding != "auto" or args.kernels != "auto":
            raise ValueError(
                "--transformers generates with transformers' generate(): without --stop, --stream, --check, --precision, --decoding "
                "or --kernels"
            )
        check_export(args.checkpoint)
        tokenizer = Tokenizer.load(args.checkpoint)  # exact bytes of the ids transformers chose
        texts = args.prompt or [DEMO_PROMPT]
        if any(not text for text in texts):
            raise ValueError("--prompt must not be empty")
        options = {"temperature": args.temperature, "top_k": args.top_k or None, "top_p": args.top_p, "seed": args.seed}
        check_sampling(**options)
    samples, seconds = transformers_generate(args.checkpoint, texts, args.max_new_tokens, **options)
    print("\n---\n".join(printable(text.encode() + tokenizer.decode(new)) for text, new in zip(texts, samples, strict=True)))
    print(f"transformers: {_speed(sum(map(len, samples)), seconds)}", file=sys.stderr)
    return 0


def run_generate(args) -> int:
    if args.transformers:
        return run_transformers_generate(args)
    with user_input():
        choice = kernels_of(args)
    with choice:
        return _generate_with_tokenmix(args)


def _generate_with_tokenmix(args) -> int:
    with user_input():
        use_threads(args)
        run = open_run(args.checkpoint, device=args.device)
        model = run.model
        model.precision = args.precision
        if model.config.task != "lm":
            raise ValueError(f"generate needs a causal LM checkpoint (task 'lm'); {args.checkpoint!r} is task {model.config.task!r}")
        tokenizer = run.text_tokenizer("generate writes text")
        texts = args.prompt or [DEMO_PROMPT]
        if any(not text for text in texts):
            raise ValueError("--prompt must not be empty")
        stop = None if args.stop is None else args.stop.replace("\\n", "\n").replace("\\t", "\t")
        if stop == "":
            raise ValueError("--stop must not be empty")
        if args.check and args.temperature != 0:
            raise ValueError("--check compares greedy decoding: use it with --temperature 0")
        check_sampling(args.temperature, args.top_k or None, args.top_p, args.seed)
        use_static_decoding(model, args.decoding, next(model.parameters()).device)  # refuses static where the model lacks it
        prompts = [tokenizer.encode(text).long() for text in texts]
        if any(prompt.numel() == 0 for prompt in prompts):
            raise ValueError("--prompt: a prompt encodes to no tokens")
    rule = StopRule(stop, model.config.vocab_size, tokenizer)
    options = {
        "temperature": args.temperature,
        "top_k": args.top_k or None,
        "top_p": args.top_p,
        "stop": stop,
        "seed": args.seed,
        "tokenizer": tokenizer,
        "decoding": args.decoding,
    }
    if args.stream:
        for index, (text, prompt) in enumerate(zip(texts, prompts, strict=True)):
            stream = TextStream(rule)
            stream.write(("" if index == 0 else "---\n").encode() + text.encode())  # the last sample ended its line
            write = lambda _row, token, out=stream: out.write_sample(tokenizer.token_bytes[token])  # noqa: E731
            generate(model, [prompt], args.max_new_tokens, **options, rows=[index], on_token=write)  # samples as row `index` of a batch
            stream.write(b"\n", final=True)
        return 0
    started = time.perf_counter()
    samples = generate(model, prompts, args.max_new_tokens, **options, progress=True)
    cached_seconds = time.perf_counter() - started
    shown = [printable(text.encode() + rule.cut(tokenizer.decode(new.tolist()))) for text, new in zip(texts, samples, strict=True)]
    print("\n---\n".join(shown))
    print(f"tokenmix: {_speed(sum(len(new) for new in samples), cached_seconds)}", file=sys.stderr)
    if args.check:
        return _check_against_recompute(model, prompts, samples, args.max_new_tokens, stop, tokenizer, cached_seconds)
    return 0


def _check_against_recompute(model, prompts, samples, max_new_tokens: int, stop, tokenizer, cached_seconds: float) -> int:
    """Decode again by recomputing the whole sequence per token; 0 if every token agrees, else 1."""
    started = time.perf_counter()
    references = [naive_generate(model, prompt, max_new_tokens, stop, tokenizer) for prompt in prompts]
    recompute_seconds = time.perf_counter() - started
    agreed = [torch.equal(new, reference) for new, reference in zip(samples, references, strict=True)]
    tokens = sum(len(new) for new in samples)
    times = f"cached {cached_seconds:.2f} s, recompute {recompute_seconds:.2f} s"
    verdict = "agree on every token" if all(agreed) else f"DISAGREE on prompts {[i + 1 for i, ok in enumerate(agreed) if not ok]}"
    print(
        f"check: cached and recompute generation {verdict} ({tokens} tokens; {times})",
        file=sys.stderr,
    )
    return 0 if all(agreed) else 1
