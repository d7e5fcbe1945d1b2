"""The cases a ``tokenmix bench`` run measures: its presets, its cases from the settings, and a check of each
at a tiny length before anything is measured.

The settings are the command's arguments (an ``argparse.Namespace``): ``apply_presets`` fills the ones
left out, ``bench_cases`` turns them into ``Case`` objects, ``check_cases`` builds and runs each once.
"""

from __future__ import annotations

import json
from dataclasses import replace

import torch

from ..mixers.registry import list_mixers
from ..models.distil import distilled_options
from ..models.registry import list_models, resolve_model_options
from .cases import CASE_KINDS, GENERATE_DEPTH, GENERATE_KINDS, KINDS, MIXER_KINDS, TRAINING_KINDS, Case, batch_for, supports
from .data import DATA
from .measure import measure
from .pathfinder import PATHFINDER
from .scale import SCALE
from .serve import SERVE

FULL = {
    "lengths": [512, 2048, 8192],
    "positions": [256, 1024, 4096, 16384],  # of --kinds generate
    "stream_lengths": [4096, 16384, 65536],
    "dim": 1536,
    "model_dim": 512,
    "batch_tokens": 4096,
    "repeats": 7,
}
QUICK = {
    "lengths": [1024],
    "positions": [256, 1024],
    "stream_lengths": [4096],
    "dim": 384,
    "model_dim": 128,
    "repeats": 3,
    "kinds": ["mixer", "model"],
}
CHECK_LENGTH = 8  # every case runs once at this length before anything is measured
KIND_LENGTHS = {"generate": "positions", "generate_mixer": "stream_lengths"}  # the argument holding a kind's lengths (else lengths)
KIND_LIMITS = {"generate": ("recompute_max",), "generate_mixer": ("direct_max_seconds",)}  # arguments a kind's cases carry


def apply_presets(args) -> None:
    """Fill the options the user left out from --quick's, the full run's or those of --kinds scale, serve, data or pathfinder."""
    preset = {**FULL, "kinds": list(TRAINING_KINDS), **(QUICK if args.quick else {})}
    for alone, presets in (("scale", SCALE), ("serve", SERVE), ("data", DATA), ("pathfinder", PATHFINDER)):
        if args.kinds and alone in args.kinds:
            if args.kinds != [alone]:
                raise ValueError(f"--kinds {alone} runs alone, not with {[kind for kind in args.kinds if kind != alone]}")
            preset = {**FULL, **presets}
    args.positions = args.lengths  # --lengths sets the positions of --kinds generate too
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)


def options_for(name: str, options: list[tuple[str, object]]) -> dict:
    """The options of one benchmarked name: KEY=VALUE apply to every name, NAME.KEY=VALUE to NAME only."""
    chosen = {}
    for key, value in options:
        scope, dot, option = key.rpartition(".")
        if not dot or scope == name:
            chosen[option] = value
    return chosen


def case_kinds(kinds: list[str]) -> list[str]:
    """The kinds of case --kinds asks for, in a fixed order (generate: the generate and generate_mixer cases)."""
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ValueError(f"kinds must be among {list(KINDS)}, got {unknown}")
    return [kind for kind in CASE_KINDS if kind in kinds or (kind == "generate_mixer" and "generate" in kinds)]


def bench_cases(args) -> list[Case]:
    """The cases the settings ask for, by kind, name, direction, length and variant (no names given: every one)."""
    args.mixers = args.mixers or list_mixers()
    args.models = args.models or list_models()
    causal_modes = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    kinds = case_kinds(args.kinds)
    benchmarked = {name for kind in kinds for name in (args.mixers if kind in MIXER_KINDS else args.models)}
    for key, _ in args.option:
        scope = key.rpartition(".")[0]
        if scope and scope not in benchmarked:
            raise ValueError(f"-o {key}: {scope!r} is not among the benchmarked names {sorted(benchmarked)}")
    cases = []
    for kind in kinds:
        names, dim = (args.mixers, args.dim) if kind in MIXER_KINDS else (args.models, args.model_dim)
        lengths = getattr(args, KIND_LENGTHS.get(kind, "lengths"))
        limits = {key: getattr(args, key) for key in KIND_LIMITS.get(kind, ())}
        for name in names:
            known = list_mixers() if kind in MIXER_KINDS else list_models()
            if name not in known:
                raise ValueError(f"{'mixer' if kind in MIXER_KINDS else 'model'} name must be one of {known}, got {name!r}")
            for causal in causal_modes:
                if not supports(kind, name, causal):
                    continue
                options = options_for(name, args.option)
                variants = [("", options)] + (distilled_variants(name, options, dim, args.distilled) if kind == "generate" else [])
                for length in lengths:
                    batch = case_batch(kind, length, args)
                    for variant, chosen in variants:
                        case = Case(kind, name, causal, length, dim, batch, args.dtype, args.device, chosen, limits, variant)
                        precision = "fp32" if kind == "generate_mixer" else args.precision  # a mixer decodes in its --dtype
                        compiled = args.compile and kind in TRAINING_KINDS
                        settings = dict(compile=compiled, compile_mode=args.compile_mode, depth=args.depth, kernels=args.kernels)
                        cases.append(replace(case, precision=precision, **settings))
        if kind == "generate_mixer":  # the distilled models' mixer beside the Toeplitz ones, at the same width and lengths
            for order, length in ((order, length) for order in args.distilled for length in lengths):
                cases.append(Case(kind, "ssm", True, length, dim, 1, args.dtype, args.device, {"order": order}, limits, f"order {order}"))
    return cases


def case_batch(kind: str, length: int, args) -> int:
    """Sequences per case: --generate-batch for a model's decoding, one for a mixer's, else ``batch_for``."""
    if kind in GENERATE_KINDS:
        return args.generate_batch if kind == "generate" else 1
    return batch_for(length, args.batch_tokens)


def distilled_variants(name: str, options: dict, dim: int, orders: list[int]) -> list[tuple[str, dict]]:
    """(variant, options) of model ``name`` with its Toeplitz mixers replaced by ``ssm`` mixers of each order (none
    where it has no Toeplitz mixer): the shapes ``tokenmix distil`` gives it, with their initial modes."""
    if not orders:
        return []
    exact = resolve_model_options(name, options, dim, GENERATE_DEPTH)
    replaced = {order: distilled_options(exact, order) for order in orders}
    return [(f"ssm {order}", tree) for order, tree in replaced.items() if tree != exact]


def check_cases(cases: list[Case]) -> None:
    """Build and run every distinct case once at a tiny length, before any measurement: a bad option
    is a ValueError naming the case, not a failure discovered an hour into the run."""
    seen = set()
    for case in cases:
        key = (case.kind, case.label, case.causal, json.dumps(case.options, sort_keys=True))
        if key in seen:
            continue
        seen.add(key)
        tiny = replace(case, length=CHECK_LENGTH, batch=1, compile=False)
        try:
            if case.kind not in TRAINING_KINDS:
                measure(tiny, repeats=1)  # decoding: the prefill, steps and recompute (tiled and direct) of 8 tokens
            else:
                module, inputs = tiny.build()
                with torch.no_grad():
                    module(inputs)
        except (ValueError, TypeError) as error:
            raise ValueError(
                f"{case.kind} {case.label!r} ({'causal' if case.causal else 'bidirectional'}) with options {case.options}: {error}"
            ) from None
