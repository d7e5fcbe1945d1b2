"""The streaming contract, over the registries: any chunking through ``step`` equals one forward.

Every causal mixer (``list_mixers()``) and every causal language model (``list_models()``) is held
to it at lengths 1, 7, 100, 1000 and 1024, float32 (relative error <= 1e-5) and float64
(<= 1e-10), with padding masks, and cached generation to recompute generation token for token.
"""

import functools

import pytest
import torch
from conftest import LENGTHS, random_chunks, relative_error
from test_contracts import CAUSAL, LM_MODELS, MODES, mixer, model, padded_pair

import tokenmix
from tokenmix.generation import naive_generate
from tokenmix.models.registry import resolve_model_options

TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-10}


def streamed(step, x: torch.Tensor, chunks: list[slice], state, mask=None):
    """Outputs of ``step`` over x cut into ``chunks``, concatenated, and the last state."""
    outputs = []
    for chunk in chunks:
        y, state = step(x[:, chunk], state, None if mask is None else mask[:, chunk])
        outputs.append(y)
    return torch.cat(outputs, dim=1), state


def prompt_then_tokens(n: int) -> list[slice]:
    """A prompt of half the stream in one call, then one token per call."""
    half = max(1, n // 2)
    return [slice(0, half)] + [slice(t, t + 1) for t in range(half, n)]


CHUNKINGS = {"random": random_chunks, "prompt": prompt_then_tokens}


def chunkings(length: int, dtype: torch.dtype) -> list:
    """Both chunkings up to 128 tokens. Past it the random chunks in both dtypes, and the prompt then one token
    per call (n/2 calls, most of a case's time) in float32, the dtype decoding runs in, where round-off grows
    over the steps; float64 holds single steps to 1e-10 at 1, 7 and 100 tokens, and the random chunks
    (single tokens among them) at every length."""
    if length > 128 and dtype == torch.float64:
        return [random_chunks]
    return list(CHUNKINGS.values())


def causal_mixer(name, dtype):
    return mixer(name, True).to(dtype).eval()


# --- mixers --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("name", CAUSAL)
def test_mixer_streaming_equals_forward(name, length, dtype):
    module = causal_mixer(name, dtype)
    x = torch.randn(2, length, module.dim, dtype=dtype)
    with torch.no_grad():
        whole = module(x)
        for chunking in chunkings(length, dtype):
            y, _ = streamed(module.step, x, chunking(length), module.init_state(2, dtype=dtype, max_length=length))
            assert relative_error(y, whole) <= TOLERANCE[dtype], chunking.__name__


@pytest.mark.parametrize("name", CAUSAL)
def test_mixer_streaming_with_padding_equals_forward(name):
    module = causal_mixer(name, torch.float64)
    x, _, mask = padded_pair((2, 60), lambda: torch.randn(2, 60, module.dim, dtype=torch.float64))
    with torch.no_grad():
        y, _ = streamed(module.step, x, random_chunks(60, seed=3), module.init_state(2, dtype=torch.float64, max_length=60), mask)
        assert relative_error(y, module(x, mask)) <= 1e-10


def front_padded(step, x: torch.Tensor, pad: int, init, pad_value):
    """The outputs at x's tokens of a stream that starts with ``pad`` masked positions (``pad_value``),
    prefilled in one call and then stepped one token at a time, and its last state."""
    padded = torch.cat([torch.full_like(x[:, :1], pad_value).expand(-1, pad, *x.shape[2:]), x], dim=1)
    mask = torch.arange(padded.shape[1]).expand(x.shape[0], -1) >= pad
    half = pad + max(1, x.shape[1] // 2)
    chunks = [slice(0, half)] + [slice(t, t + 1) for t in range(half, padded.shape[1])]
    outputs, state = streamed(step, padded, chunks, init(), mask)
    return outputs[:, pad:], state


def front_padding_cases(period: int | None) -> list[tuple[int, bool]]:
    """(padding, whether it must leave the outputs): multiples of the period must; with a period past 1,
    one position less should not (else the declared period is larger than needed)."""
    if period is None:
        return []
    return [(period, True), (3 * period, True)] + ([(period - 1, False)] if period > 1 else [])


@pytest.mark.parametrize("name", CAUSAL)
def test_a_stream_padded_in_front_by_whole_periods_gives_the_stream_alone(name):
    """``Mixer.front_padding_period``: fails if a mixer declares a period its stream does not keep."""
    module = causal_mixer(name, torch.float64)
    x = torch.randn(2, 20, module.dim, dtype=torch.float64)
    with torch.no_grad():
        alone, _ = streamed(module.step, x, prompt_then_tokens(20), module.init_state(2, dtype=torch.float64, max_length=128))
        for pad, keeps in front_padding_cases(module.front_padding_period):
            padded, _ = front_padded(module.step, x, pad, lambda: module.init_state(2, dtype=torch.float64, max_length=128), 7.0)
            assert (relative_error(padded, alone) <= 1e-10) == keeps, pad


@pytest.mark.parametrize("length", [20, 80])  # a prompt of 10 or 40 tokens after the padding (the online and parallel paths)
@pytest.mark.parametrize("pad", [1, 7, 100])
@pytest.mark.parametrize("name", CAUSAL)
def test_a_stream_started_after_masked_padding_equals_one_that_reads_it(name, pad, length):
    """``init_state(masked=P)`` (``Mixer.after_padding``): the state reading P masked positions leaves."""
    module = causal_mixer(name, torch.float64)
    x = torch.randn(2, length, module.dim, dtype=torch.float64)

    def init(masked=0):
        return module.init_state(2, dtype=torch.float64, max_length=pad + length + 1, masked=masked)

    with torch.no_grad():
        read, read_state = front_padded(module.step, x, pad, init, 7.0)
        started, started_state = streamed(module.step, x, prompt_then_tokens(length), init(pad))
        assert relative_error(started, read) <= 1e-10
        assert_rows_share_a_batch(module.step, started_state, read_state, torch.randn(2, 1, module.dim, dtype=torch.float64))


def assert_rows_share_a_batch(step, state, other, x: torch.Tensor) -> None:
    """Two streams at one position join one batch (``concat``: a server's continuous batching) and step on as apart."""
    joined, _ = step(torch.cat([x, x]), type(state).concat([state, other]), None)
    apart = torch.cat([step(x, state, None)[0], step(x, other, None)[0]])
    assert relative_error(joined, apart) <= 1e-10


@pytest.mark.parametrize("name", CAUSAL)
def test_a_prefill_leaves_the_state_that_single_steps_leave(name):
    module = causal_mixer(name, torch.float64)
    x = torch.randn(2, 90, module.dim, dtype=torch.float64)
    singles = [slice(t, t + 1) for t in range(80)]
    with torch.no_grad():
        _, prefilled = module.step(x[:, :80], module.init_state(2, dtype=torch.float64, max_length=90))
        _, stepped = streamed(module.step, x[:, :80], singles, module.init_state(2, dtype=torch.float64, max_length=90))
        after_prefill, _ = streamed(module.step, x[:, 80:], singles[:10], prefilled)
        after_steps, _ = streamed(module.step, x[:, 80:], singles[:10], stepped)
    assert relative_error(after_prefill, after_steps) <= 1e-10


@pytest.mark.parametrize("name", CAUSAL)
def test_a_state_grows_with_the_position_unless_declared_bounded(name):
    """``bounded_state``: at positions 300 and 556 (256 later: the same place in a chunk of 128) the state
    has one size; an unbounded one (a history, a key cache) is larger at 556."""
    module = causal_mixer(name, torch.float32)
    x = torch.randn(1, 556, module.dim)
    with torch.no_grad():
        _, early = module.step(x[:, :300], module.init_state(1, max_length=556))
        early_bytes = early.nbytes()
        _, late = module.step(x[:, 300:], early)
    assert early_bytes > 0 and (late.nbytes() == early_bytes) == module.bounded_state


@pytest.mark.parametrize("name", CAUSAL)
def test_bad_streaming_input_is_refused_with_what_was_expected(name):
    module = causal_mixer(name, torch.float32)
    state = module.init_state(2, max_length=20)
    x = torch.randn(2, 3, module.dim)
    with pytest.raises(ValueError, match="batch size"):
        module.step(x[:1], state)
    with pytest.raises(ValueError, match="float64"):
        module.step(x.double(), state)
    with pytest.raises(ValueError, match="channels"):
        module.step(torch.randn(2, 3, module.dim + 2), state)
    other = next(n for n in CAUSAL if type(causal_mixer(n, torch.float32).init_state(1, max_length=20)) is not type(state))
    with pytest.raises(ValueError, match=f"must be a {type(state).__name__}"):
        module.step(x, causal_mixer(other, torch.float32).init_state(2, max_length=20))


@pytest.mark.parametrize("name", sorted({name for name, causal in MODES if not causal}))
def test_bidirectional_mixers_refuse_to_stream(name):
    with pytest.raises(ValueError, match="causal=True"):
        mixer(name, False).init_state(1)


def test_fd_tno_streams_the_operator_of_its_horizon_and_doubles_it():
    """No max_length: outputs up to 1024 are those of a 1024-token forward, later ones of a 2048-token forward."""
    module = causal_mixer("fd_tno", torch.float64)
    x = torch.randn(1, 2048, module.dim, dtype=torch.float64)
    chunks = random_chunks(1024, seed=1) + [slice(1024, 1030), slice(1030, 1500)]
    with torch.no_grad():
        y, state = streamed(module.step, x[:, :1500], chunks, module.init_state(1, dtype=torch.float64))
        assert relative_error(y[:, :1024], module(x[:, :1024])) <= 1e-10
        assert relative_error(y[:, 1024:], module(x)[:, 1024:1500]) <= 1e-10
    assert state.horizon == 2048


def test_streams_of_two_horizons_stepping_in_turn_keep_their_taps(monkeypatch):
    """fd_tno's taps depend on the horizon: two streams stepped alternately (a bench's reference stream,
    generations interleaved) compute each horizon's taps once, not at every step."""
    module = causal_mixer("fd_tno", torch.float64)
    computed = []
    taps = type(module).stream_taps
    monkeypatch.setattr(type(module), "stream_taps", lambda self, lags, horizon: computed.append(horizon) or taps(self, lags, horizon))
    states = [module.init_state(1, dtype=torch.float64, max_length=length) for length in (100, 300)]
    x = torch.randn(1, 1, module.dim, dtype=torch.float64)
    with torch.no_grad():
        for _ in range(5):
            for index, state in enumerate(states):
                states[index] = module.step(x, state)[1]
    assert sorted(computed) == [100, 300]


def test_an_auto_dilated_tcn_streams_up_to_the_length_it_was_told():
    module = mixer("tcn", True, dilation_factor="auto").double().eval()
    with pytest.raises(ValueError, match="max_length"):
        module.init_state(1)
    x = torch.randn(1, 40, module.dim, dtype=torch.float64)
    with torch.no_grad():
        y, state = streamed(module.step, x, random_chunks(40), module.init_state(1, dtype=torch.float64, max_length=40))
        assert relative_error(y, module(x)) <= 1e-10
        with pytest.raises(ValueError, match="max_length=40"):
            module.step(x[:, :1], state)


# --- models --------------------------------------------------------------------------------------
def model_step(network):
    def step(tokens, state, mask):
        return network(tokens, mask, state=state, return_state=True)

    return step


def module_kinds(network) -> set[str]:
    return {type(module).__name__ for module in network.modules()}


def narrow_model(name, task, depth):
    extra = {"num_classes": 3} if task == "classify" else {}
    if "chunk_size" in resolve_model_options(name, {}, dim=8, depth=depth):
        extra["chunk_size"] = 8
    return tokenmix.build_model(name, task=task, vocab_size=20, dim=8, depth=depth, **extra)


@functools.cache
def fewest_layers(name, task) -> int:
    """How many layers (one, or two for fnet_ar_xl's attention and FNetAR layers) hold every kind of module
    ``model(name, task)`` holds; found once per process (``smallest_model`` is built many times)."""
    kinds = module_kinds(model(name, task))
    for depth in (1, 2):
        if module_kinds(narrow_model(name, task, depth)) == kinds:
            return depth
    raise AssertionError(f"{name}: no model of depth 1 or 2 holds every kind of its modules")


def smallest_model(name, task="lm"):
    """Width 8 and the fewest layers that hold every kind of module ``model(name, task)`` holds:
    a stream costs a call per layer per token."""
    return narrow_model(name, task, fewest_layers(name, task))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("name", LM_MODELS)
def test_model_streaming_equals_forward(name, length, dtype):
    """Lengths past 128 are past what a model of these tests would be trained on; the stream does not care.
    There the model is ``smallest_model`` (the two layers of width 16 of the shorter lengths pass a state
    from layer to layer, which the longer lengths need not repeat)."""
    network = (smallest_model(name) if length > 128 else model(name)).to(dtype).eval()
    tokens = torch.randint(0, 20, (2, length))
    with torch.no_grad():
        whole = network(tokens)
        for chunking in chunkings(length, dtype):
            state = network.init_state(2, dtype=dtype, max_length=length)
            logits, state = streamed(model_step(network), tokens, chunking(length), state)
            assert relative_error(logits, whole) <= TOLERANCE[dtype], chunking.__name__
            assert state.position == length


@pytest.mark.parametrize("name", LM_MODELS)
def test_model_streaming_with_padding_equals_forward(name):
    network = model(name).double().eval()
    tokens, _, mask = padded_pair((2, 50), lambda: torch.randint(0, 20, (2, 50)))
    with torch.no_grad():
        logits, _ = streamed(model_step(network), tokens, random_chunks(50, seed=2), network.init_state(2, max_length=50), mask)
        assert relative_error(logits, network(tokens, mask)) <= 1e-10


@pytest.mark.parametrize("name", LM_MODELS)
def test_a_model_stream_told_where_its_rows_end_gives_their_logits_before_the_ends(name):
    """``StreamState.limit_steps`` after a prompt (a server's and ``generate``'s rows' ends): each row's
    logits before its end equal one forward's however far the others go (the online Toeplitz product
    cuts its tiles at the furthest end; the other states ignore it)."""
    network = model(name).double().eval()
    length, prompt = 200, 40
    tokens = torch.randint(0, 20, (3, length))
    steps = torch.tensor([30, 97, length - prompt])
    with torch.no_grad():
        whole = network(tokens)
        _, state = network(tokens[:, :prompt], state=network.init_state(3, max_length=length), return_state=True)
        one_by_one = [slice(t, t + 1) for t in range(prompt, length)]
        logits, _ = streamed(model_step(network), tokens, one_by_one, state.limit_steps(steps))
    for row, count in enumerate(steps.tolist()):
        assert relative_error(logits[row, :count], whole[row, prompt : prompt + count]) <= 1e-10


@pytest.mark.parametrize("name", LM_MODELS)
def test_a_model_stream_padded_in_front_by_whole_periods_gives_the_stream_alone(name):
    """``SequenceModel.front_padding_period``, the model's least common period of its blocks'."""
    network = model(name).double().eval()
    tokens = torch.randint(0, 20, (2, 20))
    with torch.no_grad():
        alone, _ = streamed(model_step(network), tokens, prompt_then_tokens(20), network.init_state(2, max_length=128))
        for pad, keeps in front_padding_cases(network.front_padding_period):
            padded, _ = front_padded(model_step(network), tokens, pad, lambda: network.init_state(2, max_length=128), 3)
            assert (relative_error(padded, alone) <= 1e-10) == keeps, pad
    declared = {"tnn": 1, "mega": 8, "tcnca": 8, "transformer_xl": None}  # a few the others' reading confirms
    assert declared.get(name, network.front_padding_period) == network.front_padding_period


@pytest.mark.parametrize("name", LM_MODELS)
def test_a_model_stream_started_after_masked_padding_equals_one_that_reads_it(name):
    """``init_state(masked=P)``: the logits and position of a stream that reads P masked tokens first;
    refused where padding would not stay out of the stream (a Transformer-XL memory: no period)."""
    network = model(name).double().eval()
    tokens = torch.randint(0, 20, (2, 40))
    if network.front_padding_period is None:
        with pytest.raises(ValueError, match="masked must be 0"):
            network.init_state(2, masked=3)
        return
    with torch.no_grad():
        for pad in (1, 8, 100):
            init = functools.partial(network.init_state, 2, max_length=pad + 41)
            read, read_state = front_padded(model_step(network), tokens, pad, init, 3)
            started, state = streamed(model_step(network), tokens, prompt_then_tokens(40), init(masked=pad))
            assert relative_error(started, read) <= 1e-10 and state.position == pad + 40, pad
            assert_rows_share_a_batch(model_step(network), state, read_state, torch.randint(0, 20, (2, 1)))


@pytest.mark.parametrize("name", LM_MODELS)
def test_greedy_cached_generation_equals_recompute_and_batching_changes_nothing(name):
    network = model(name).double()
    prompts = [torch.randint(0, 20, (size,)) for size in (3, 11, 1)]
    batched = tokenmix.generate(network, prompts, 30, temperature=0)
    for prompt, new in zip(prompts, batched, strict=True):
        assert torch.equal(new, naive_generate(network, prompt, 30))
        assert torch.equal(new, tokenmix.generate(network, [prompt], 30, temperature=0)[0])


def test_generate_reads_prompts_of_any_integer_dtype():
    """A byte tokenizer encodes to uint8, whose comparisons wrap (256 reads as 0 there)."""
    network = model("tnn").eval()
    prompt = torch.tensor([3, 11, 19])
    expected = tokenmix.generate(network, [prompt], 5, temperature=0)[0]
    assert torch.equal(tokenmix.generate(network, [prompt.to(torch.uint8)], 5, temperature=0)[0], expected)
    with pytest.raises(ValueError, match=r"range \[3, 300\]"):
        network(torch.tensor([[3, 300]], dtype=torch.int16))


@pytest.mark.parametrize("name", LM_MODELS)
def test_a_rows_sample_depends_on_the_seed_and_its_row_only(name):
    """Each row samples from the generator of (seed, row) and draws only for its own new tokens. Fails if the
    rows share one generator, or a row draws while it still reads its prompt (its prompt length would shift it)."""
    network = model(name).double()
    prompts = [torch.randint(0, 20, (size,)) for size in (3, 11, 1)]
    options = {"temperature": 1.0, "top_k": 12, "top_p": 0.95, "seed": 5}
    batched = tokenmix.generate(network, prompts, 25, **options)
    for row, prompt in enumerate(prompts):
        assert torch.equal(tokenmix.generate(network, [prompt], 25, **options, rows=[row])[0], batched[row])
    assert all(map(torch.equal, tokenmix.generate(network, prompts[1:], 25, **options, rows=[1, 2]), batched[1:]))
    other_seed = tokenmix.generate(network, prompts, 25, **{**options, "seed": 6})
    assert not all(map(torch.equal, other_seed, batched))  # the seed matters


@pytest.mark.parametrize("name", LM_MODELS)
def test_a_model_state_moves_selects_and_joins_rows_and_reports_its_size(name):
    network = model(name).double().eval()
    tokens = torch.randint(0, 20, (3, 12))
    with torch.no_grad():
        _, state = network(tokens[:, :10], state=network.init_state(3, max_length=12), return_state=True)
        kept = state.select([2, 0])
        logits, _ = network(tokens[[2, 0], 10:], state=kept.to("cpu"), return_state=True)
        assert relative_error(logits, network(tokens[[2, 0]])[:, 10:]) <= 1e-10
        joined = type(state).concat([state.select([1]), kept])  # rows streamed apart, decoded as one batch
        logits, _ = network(tokens[[1, 2, 0], 10:], state=joined, return_state=True)
        assert relative_error(logits, network(tokens[[1, 2, 0]])[:, 10:]) <= 1e-10
        _, later = network(tokens[:1, 10:11], state=state.select([0]), return_state=True)
        with pytest.raises(ValueError, match="position"):
            type(state).concat([state.select([0]), later])  # streams at different positions cannot share a batch
    assert state.nbytes() > 0 and kept.batch_size == 2


@pytest.mark.parametrize("name", LM_MODELS)
def test_a_model_refuses_a_state_it_did_not_make(name):
    network = model(name).eval()
    tokens = torch.randint(0, 20, (2, 4))
    with pytest.raises(ValueError, match="batch size"):
        network(tokens, state=network.init_state(3), return_state=True)
    with pytest.raises(ValueError, match="float64"):
        network(tokens, state=network.init_state(2, dtype=torch.float64), return_state=True)
    other = next(n for n in LM_MODELS if n != name)
    with pytest.raises(ValueError, match="another model"):
        network(tokens, state=model(other).init_state(2), return_state=True)
    with pytest.raises(ValueError, match="ModelState"):
        network(tokens, state=[], return_state=True)


def test_models_of_other_tasks_do_not_stream():
    with pytest.raises(ValueError, match="task"):
        model("tnn", task="mlm").init_state(1)
