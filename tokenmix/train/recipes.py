"""Recipes: named training presets with their sources (``tokenmix train --recipe NAME``).

A recipe is a set of ``TrainConfig`` values (model options under ``options``). Values given on
the command line (or as keyword arguments) override the recipe's; ``-o`` options are added to its
options. The run's config records the recipe's name beside the values it resolved to.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Recipe:
    description: str
    source: str  # where the values come from: a paper's table or section, or "this library" for our CPU-scale choices
    settings: dict = field(default_factory=dict)


_RECIPES: dict[str, Recipe] = {}
DIRECTORY = "DIR"  # in a recipe's data: the folder the user downloaded, which --data must name


def list_recipes() -> list[str]:
    return sorted(_RECIPES)


def recipe(name: str) -> Recipe:
    if name not in _RECIPES:
        raise ValueError(f"recipe must be one of {list_recipes()} (`tokenmix recipes` describes them), got {name!r}")
    return _RECIPES[name]


def apply_recipe(name: str | None, given: dict, notes: list[str] | None = None) -> dict:
    """``given`` TrainConfig values over those of recipe ``name`` (None: ``given`` alone); options merged.

    A recipe's warmup follows a ``steps`` given over its own (the same fraction of the run) unless
    ``warmup`` is given too; ``notes`` (a list) receives a line saying so.
    """
    if name is None:
        return dict(given)
    settings = recipe(name).settings
    if DIRECTORY in settings.get("data", "").split(":") and "data" not in given:
        form = settings["data"].replace(DIRECTORY, "/path/to/the/release")
        raise ValueError(
            f"recipe {name!r} reads files you download: give --data {form} (docs/lra.md and docs/language.md, 'Data', have the layouts)"
        )
    options = {**settings.get("options", {}), **given.get("options", {})}
    merged = {**settings, **given, "recipe": name}
    if options:
        merged["options"] = options
    scaled = given.get("steps") is not None and settings.get("steps") and settings.get("warmup") and "warmup" not in given
    if scaled:
        merged["warmup"] = settings["warmup"] * given["steps"] // settings["steps"]
        if notes is not None:
            notes.append(
                f"recipe {name}: warmup {settings['warmup']} of its {settings['steps']} steps scaled to {merged['warmup']} "
                f"of --steps {given['steps']} (give --warmup to set it)"
            )
    return merged


def _add(name: str, description: str, source: str, **settings) -> None:
    _RECIPES[name] = Recipe(description, source, settings)


def _table(columns: str, row: tuple) -> dict:
    return dict(zip(columns.split(), row, strict=True))


# --- Long Range Arena (Tay et al., "Long Range Arena: A Benchmark for Efficient Transformers", arXiv 2011.04006) ---
# The data of each task; DIR stands for the folder a user downloaded (docs/lra.md, "Data").
LRA_DATA = {
    "listops": "listops",  # generated with the release's settings; the release's own files: listops:DIR
    "text": "lra-text:DIR:max_length=4096",
    "retrieval": "lra-retrieval:DIR:max_length=4000",
    "image": "lra-image:DIR",
    "pathfinder": "lra-pathfinder:DIR:resolution=32",
    "pathx": "lra-pathfinder:DIR:resolution=128",
}
GRID_TASKS = ("image", "pathfinder", "pathx")

# TNN (Qin et al., "Toeplitz Neural Network for Sequence Modeling", arXiv 2305.04749): the per-task values of its
# LRA scripts (OpenNLPLab/lra, script_lra.py), which override the experiment YAMLs. steps = the YAMLs' max_epochs x
# training examples / batch (their cosine schedule is set for 50,000 steps; ours decays to 0 over the run). The
# 2-D tasks run its separable 2-D operator. Differences: our blocks use LayerNorm (theirs SyncBatchNorm).
TNN_COLUMNS = "depth dim expand glu_expand rpe_dim decay dropout lr weight_decay batch_size warmup steps pool"
TNN_LRA = {
    "listops": (4, 128, 1, 1.0, 32, 1.0, 0.0, 5e-4, 0.1, 128, 1000, 30000, "mean"),
    "text": (4, 128, 1, 2.0, 32, 0.9, 0.1, 1.05e-3, 1e-3, 32, 3000, 25000, "mean"),
    "retrieval": (2, 64, 1, 1.5, 16, 0.6, 0.0, 1e-2, 0.01, 64, 25000, 45965, "mean"),
    "image": (12, 128, 2, 3.0, 16, 0.7, 0.1, 7e-3, 1e-3, 200, 30000, 45000, "mean"),
    "pathfinder": (6, 64, 3, 2.5, 16, 1.0, 0.0, 1e-3, 0.0, 128, 5000, 250000, "last"),
    "pathx": (6, 64, 3, 2.5, 16, 0.999, 0.0, 1e-4, 0.0, 64, 312, 250000, "last"),
}
TNN_SOURCE = "TNN LRA scripts (OpenNLPLab/lra, script_lra.py); Qin et al. arXiv 2305.04749"
SKI_FD_SOURCE = "SKI to go Faster (Moreno et al., arXiv 2305.09028) §5.2 on the TNN LRA scripts"

# MEGA (Ma et al., "Mega: Moving Average Equipped Gated Attention", arXiv 2209.10655): facebookresearch/mega,
# examples/mega/README.lra.md and the lra architectures. Adam (0.9, 0.98), clip 1.0, linear decay to 0, mean
# pooling, hidden and FFN width 2 x dim, N = 16, no chunking (chunk -1). Differences: softmax attention
# everywhere (theirs Laplace on the 2-D tasks) and LayerNorm (theirs scale/batch norm on some tasks).
MEGA_COLUMNS = "depth dim z_dim dropout lr weight_decay batch_size warmup steps"
MEGA_LRA = {
    "listops": (6, 80, 64, 0.1, 1e-3, 0.01, 64, 3000, 90000),
    "text": (4, 128, 64, 0.1, 4e-3, 0.01, 50, 10000, 25000),
    "retrieval": (6, 128, 64, 0.1, 3e-3, 0.04, 64, 10000, 91960),
    "image": (8, 160, 96, 0.0, 1e-2, 0.02, 50, 9000, 180000),
    "pathfinder": (6, 128, 64, 0.0, 1e-2, 0.01, 128, 50000, 250000),
    "pathx": (4, 64, 32, 0.0, 1e-2, 0.01, 128, 25000, 125000),
}
MEGA_SOURCE = "MEGA LRA settings (facebookresearch/mega README.lra.md); Ma et al. arXiv 2209.10655"
TCNCA_SOURCE = "TCNCA (Terzic et al., arXiv 2312.05605) Appendix D: MEGA's LRA settings, EMA replaced by a TCN"

# The LRA Transformer (google-research/long-range-arena configs). Its text-task rate 0.05 x warmup ramp x
# rsqrt decay peaks at 0.05 / sqrt(warmup), the peak given here; the 2-D tasks use cosine decay after a warmup of
# one epoch (training examples // batch). CLS pooling is
# read as the first token (there is no CLS token here); qkv widths narrower than the model are not modelled.
TRANSFORMER_COLUMNS = "depth dim heads ffn_expand lr weight_decay batch_size warmup steps dropout pool schedule"
TRANSFORMER_LRA = {
    "listops": (6, 512, 8, 4, 1.58e-3, 0.1, 32, 1000, 5000, 0.0, "first", "inverse_sqrt"),
    "text": (4, 256, 4, 4, 5.59e-4, 0.1, 32, 8000, 20000, 0.0, "first", "inverse_sqrt"),
    "retrieval": (4, 128, 4, 4, 5.59e-4, 0.1, 32, 8000, 5000, 0.0, "first", "inverse_sqrt"),
    "image": (1, 32, 1, 2, 5e-4, 0.0, 256, 175, 35000, 0.3, "first", "cosine"),
    "pathfinder": (1, 128, 4, 1, 1e-3, 0.0, 512, 312, 62400, 0.2, "mean", "cosine"),
    "pathx": (1, 32, 2, 1, 1e-3, 0.0, 64, 2500, 500000, 0.1, "mean", "cosine"),
}
TRANSFORMER_SOURCE = "LRA Transformer configs (google-research/long-range-arena); Tay et al. arXiv 2011.04006"

TWO_D_MIXER = "separable2d"  # the 1-D operator along rows, then along columns


def _tnn_recipes() -> None:
    for task, row in TNN_LRA.items():
        values = _table(TNN_COLUMNS, row)
        options = {key: values.pop(key) for key in ("expand", "glu_expand", "rpe_dim", "decay")}
        common = dict(task="classify", data=LRA_DATA[task], min_lr_ratio=0.0, schedule="cosine", **values)
        grid = task in GRID_TASKS
        tno = {"rpe_dim": options.pop("rpe_dim"), "decay": options.pop("decay")}
        tnn_options = {**options, **({"mixer": TWO_D_MIXER, "axis_mixer": "tno", **tno} if grid else tno)}
        _add(f"lra-{task}-tnn", f"TNN on LRA {task}", TNN_SOURCE, model="tnn", options=tnn_options, **common)
        ski = {"rank": 32, "filter_size": 16} if grid else {"rank": 64, "filter_size": 32}
        ski_options = {**options, "decay": 0.99, **ski, **({"mixer": TWO_D_MIXER, "axis_mixer": "ski_tno"} if grid else {})}
        _add(
            f"lra-{task}-ski_tnn",
            f"SKI-TNN on LRA {task} (r = {ski['rank']}, m = {ski['filter_size']})",
            SKI_FD_SOURCE,
            model="ski_tnn" if not grid else "tnn",
            options=ski_options,
            **common,
        )
        fd_rpe = {"rpe_dim": tno["rpe_dim"], **({"rpe_layers": 3} if task == "image" else {})}
        fd_options = {**options, **fd_rpe, **({"mixer": TWO_D_MIXER, "axis_mixer": "fd_tno"} if grid else {})}
        _add(
            f"lra-{task}-fd_tnn",
            f"FD-TNN on LRA {task}",
            SKI_FD_SOURCE,
            model="fd_tnn" if not grid else "tnn",
            options=fd_options,
            **common,
        )


def _mega_recipes() -> None:
    for task, row in MEGA_LRA.items():
        values = _table(MEGA_COLUMNS, row)
        options = {"z_dim": values.pop("z_dim"), "v_expand": 2, "ffn_expand": 2, "chunk_size": None}
        common = dict(
            task="classify", data=LRA_DATA[task], schedule="linear", min_lr_ratio=0.0, beta2=0.98, grad_clip=1.0, pool="mean", **values
        )
        _add(f"lra-{task}-mega", f"MEGA on LRA {task}", MEGA_SOURCE, model="mega", options={**options, "ndim": 16}, **common)
        tcnca = {**options, "chunk_size": 128}  # its point is chunked attention; the per-task chunks and TCN shapes are not published
        _add(
            f"lra-{task}-tcnca",
            f"TCNCA on LRA {task} (chunks of 128; TCN shape: our defaults)",
            TCNCA_SOURCE,
            model="tcnca",
            options=tcnca,
            **common,
        )


def _transformer_recipes() -> None:
    for task, row in TRANSFORMER_LRA.items():
        values = _table(TRANSFORMER_COLUMNS, row)
        options = {key: values.pop(key) for key in ("heads", "ffn_expand")}
        description = f"Transformer on LRA {task}"
        if values["warmup"] >= values["steps"]:  # retrieval: 8000 warmup steps of 5000, so the rate ramps for the whole run
            values["lr"] *= (values["steps"] - 1) / values["warmup"]  # the same ramp ends at this peak
            description += f" (their warmup of {values['warmup']} outlasts the run: the same ramp over {values['steps'] - 1} steps)"
            values["warmup"] = values["steps"] - 1
        common = dict(task="classify", data=LRA_DATA[task], min_lr_ratio=0.0, beta2=0.98, **values)
        _add(f"lra-{task}-transformer", description, TRANSFORMER_SOURCE, model="transformer", options=options, **common)


# --- Every LRA recipe at CPU scale (docs/results/lra.md, "Every preset on a CPU"): the same model, options and optimizer,
# two layers of width 64 (Path-X: 32), batches that fit 4 GB, less data, 10 minutes of training on one core. ---
LRA_CPU = {
    "listops": dict(data="listops:max_length=256:min_length=30:train=20000", batch_size=32),
    "text": dict(data="lra-text:DIR:max_length=1024", batch_size=8),
    "retrieval": dict(data="lra-retrieval:DIR:max_length=1024", batch_size=4),
    "image": dict(data="lra-image:DIR", batch_size=16),
    "pathfinder": dict(data="lra-pathfinder:DIR:resolution=32:limit=20", batch_size=16),
    "pathx": dict(data="lra-pathfinder:DIR:resolution=128:limit=2", batch_size=2, dim=32),
}
LRA_CPU_COMMON = dict(dim=64, depth=2, steps=None, minutes=10.0, warmup=100, threads=1, eval_every=200, eval_tokens=65536)
LRA_CPU_COMMON.update(final_eval_tokens=1 << 22)  # Retrieval's 18,090 validation pairs alone take MEGA 25 minutes on one core


def _lra_cpu_recipes() -> None:
    for name in [name for name in list_recipes() if name.startswith("lra-")]:
        task, full = name.split("-")[1], recipe(name)
        settings = {**full.settings, **LRA_CPU_COMMON, **LRA_CPU[task]}
        described = f"{full.description}, at CPU scale: {settings['depth']} x {settings['dim']}, 10 minutes on one core"
        _add(f"{name}-cpu", described, f"{full.source}; scaled to a CPU by this library (docs/lra.md)", **settings)


# --- Pathfinder and Path-X generated (``pathfinder-gen``, docs/lra.md "Generated Pathfinder"): each lra-pathfinder and
# lra-pathx recipe on generated images, the LRA's counts (160,000 / 20,000 / 20,000) or, at CPU scale, fewer images and
# 30 minutes on one core (the Pathfinder-32 comparison of docs/results/lra.md). ---
GENERATED_DATA = {
    "pathfinder": "pathfinder-gen:resolution=32:train=160000:val=20000:test=20000",
    "pathx": "pathfinder-gen:resolution=128:train=160000:val=20000:test=20000",
}
GENERATED_CPU_DATA = {"pathfinder": "pathfinder-gen", "pathx": "pathfinder-gen:resolution=128:train=2000:val=200:test=200"}


def _generated_pathfinder_recipes() -> None:
    for task in GENERATED_DATA:
        for name in [name for name in list_recipes() if name.startswith(f"lra-{task}-") and not name.endswith("-cpu")]:
            model, full, cpu = name.split("-", 2)[2], recipe(name), recipe(f"{name}-cpu")
            _add(
                f"{task}-gen-{model}",
                f"{full.description}, on generated images (pathfinder-gen, the LRA's counts)",
                f"{full.source}; images generated by this library",
                **{**full.settings, "data": GENERATED_DATA[task]},
            )
            settings = {**cpu.settings, "data": GENERATED_CPU_DATA[task], "minutes": 30.0}
            _add(
                f"{task}-gen-{model}-cpu",
                f"{full.description}, at CPU scale: {settings['depth']} x {settings['dim']}, 30 minutes on one core, on generated images",
                f"{cpu.source}; images generated by this library",
                **settings,
            )


# --- ListOps at CPU scale: every model with the same data, size, optimizer and time budget (docs/lra.md) ---
LISTOPS_CPU_DATA = "listops:max_length=256:min_length=30:train=20000"  # 30 < length < 256, the release's depth and arguments
LISTOPS_CPU_MODELS = ("tnn", "fd_tnn", "ski_tnn", "tcnca", "mega", "transformer")


def _listops_cpu_recipes() -> None:
    common = dict(task="classify", data=LISTOPS_CPU_DATA, dim=64, depth=2, batch_size=32, lr=2e-3, warmup=200, steps=None, minutes=15.0)
    common.update(schedule="cosine", weight_decay=0.1, threads=1, eval_every=250, pool="mean")
    for model in LISTOPS_CPU_MODELS:
        _add(
            f"listops-cpu-{model}",
            f"{model} on ListOps of 30 to 256 tokens, 15 minutes on one core",
            "this library (docs/lra.md)",
            model=model,
            **common,
        )


# --- the 2-D operator against a 1-D TNN on the same pixels (docs/results/lra.md, "2-D images") ---
def _shapes_recipes() -> None:
    common = dict(task="classify", data="shapes", dim=64, depth=2, batch_size=32, lr=2e-3, warmup=100, steps=None, minutes=5.0)
    common.update(schedule="cosine", weight_decay=0.1, threads=1, eval_every=100, pool="mean")
    for model, reading in (("tnn2d", "a 16 x 16 grid (2-D TNO)"), ("tnn", "a flat sequence of 256 pixels (1-D TNO)")):
        _add(
            f"shapes-{model}",
            f"{model} on generated shapes, pixels as {reading}, 5 minutes on one core",
            "this library (docs/lra.md)",
            model=model,
            **common,
        )


# --- Language modelling (docs/language.md). DIR: the WikiText release folder, or the enwik8 file. ---
# TNN (Qin et al. arXiv 2305.04749) Tables 12-13 (Appendix D): 6 x 512, GTU 1536 (expand 3), GLU 512, RPE 6 x 64
# ReLU, decay 0.99, Adam (0.9, 0.98), inverse-sqrt after 4k warmup, weight decay 0.2, 512 tokens, 128 sequences,
# 50k updates. Its peak rate is 5e-4 in Table 12 (§4.1 writes 0.005; SKI to go Faster calls 5e-4 the default).
# Its BPE is RoBERTa's 50,265 entries: give --tokenizer PATH/tokenizer.json to use that file; bpe:50265 learns one
# of that size from the training split instead. Dropout is not stated (ours: 0.1, fairseq's LM default).
TNN_LM = dict(
    model="tnn", task="lm", data="wikitext:DIR", tokenizer="bpe:50265", dim=512, depth=6, seq_len=512, batch_size=128,
    steps=50000, lr=5e-4, schedule="inverse_sqrt", warmup=4000, weight_decay=0.2, beta1=0.9, beta2=0.98, dropout=0.1,
    eval_every=2000, save_every="30m",
)  # fmt: skip
TNN_LM_OPTIONS = {"expand": 3, "glu_expand": 1.0, "rpe_layers": 6, "rpe_dim": 64, "activation": "relu", "decay": 0.99}
TNN_LM_SOURCE = "TNN (Qin et al., arXiv 2305.04749) Tables 12 and 13, Appendix D"
# Transformer-XL's WikiText-103 base script (kimiyoung/transformer-xl, pytorch/run_wt103_base.sh: 16 layers,
# d 410, 10 heads, d_inner 2100, dropout 0.1, Adam lr 2.5e-4 cosine, no warmup, target = memory = 150 tokens,
# batch 60, 200k steps). FNetAR (Lou et al., arXiv 2107.10932, §III.1) reports its medium model against this one,
# half of the attention layers replaced by causal Fourier mixing; the paper's text gives no other value.
XL_BASE = dict(
    task="lm", data="wikitext:DIR", tokenizer="bpe:50265", dim=410, depth=16, seq_len=150, batch_size=60, steps=200000,
    lr=2.5e-4, schedule="cosine", min_lr_ratio=0.0, warmup=0, dropout=0.1, eval_every=4000, save_every="30m",
)  # fmt: skip
XL_OPTIONS = {"heads": 10, "ffn_expand": 2100 / 410, "memory_length": 150}
XL_SOURCE = "Transformer-XL WikiText-103 base script (kimiyoung/transformer-xl); FNetAR (Lou et al., arXiv 2107.10932) §III.1"
# The CPU-scale runs of docs/results/language_models.md: the README demo's settings with a BPE; the XL models with the step
# counts their byte-level runs reached in six minutes (docs/results/language_models.md), so each pair trains equally long.
SHAKESPEARE_BPE_MODELS = {
    "tnn": {},
    "fd_tnn": {},
    "ski_tnn": {},
    "tcnca": {},
    "mega": {},
    "transformer": {},
    "transformer_xl": {"steps": 134},
    "fnet_ar_xl": {"steps": 240},
}


def _language_recipes() -> None:
    _add("wikitext103-tnn", "TNN causal LM on WikiText-103", TNN_LM_SOURCE, **TNN_LM, options=TNN_LM_OPTIONS)
    _add(
        "wikitext103-tnn-mlm",
        "TNN bidirectional (RoBERTa-style) masked LM on WikiText-103: 12 x 768, GTU 2304, 512 sequences, 3k warmup",
        f"{TNN_LM_SOURCE} (the Roberta column; polynomial decay of power 1 is linear; Adam eps 1e-6 is not exposed)",
        **{**TNN_LM, "task": "mlm", "dim": 768, "depth": 12, "batch_size": 512, "warmup": 3000, "schedule": "linear"},
        min_lr_ratio=0.0,
        options=TNN_LM_OPTIONS,
    )
    _add(
        "wikitext103-fd_tnn",
        "FD-TNN causal LM on WikiText-103: TNN's settings with 7 layers, a 3-layer RPE and lr 1e-3",
        "SKI to go Faster (Moreno et al., arXiv 2305.09028) Appendix F.1.1 and Fig. 7, on TNN's Tables 12 and 13",
        **{**TNN_LM, "model": "fd_tnn", "depth": 7, "lr": 1e-3},
        options={key: value for key, value in {**TNN_LM_OPTIONS, "rpe_layers": 3}.items() if key != "decay"},  # FD has no decay bias
    )
    _add(
        "wikitext103-transformer_xl",
        "Transformer-XL base on WikiText-103",
        XL_SOURCE,
        model="transformer_xl",
        **XL_BASE,
        options=XL_OPTIONS,
    )
    _add(
        "wikitext103-fnet_ar_xl",
        "FNetAR-XL on WikiText-103: Transformer-XL base with half its layers causal Fourier mixing",
        XL_SOURCE,
        model="fnet_ar_xl",
        **XL_BASE,
        options={**XL_OPTIONS, "fourier_layers": 8, "window": 150},
    )
    _add(
        "enwik8-tcnca",
        "TCNCA on enwik8 (bytes:FILE): lr 0.005, weight decay 0.2, attention chunks of 2048, 4096-byte windows",
        "TCNCA (Terzic et al., arXiv 2312.05605) Appendices D and F; sizes and schedule are MEGA's, not in the paper: ours",
        model="tcnca", task="lm", data="bytes:DIR", lr=5e-3, weight_decay=0.2, seq_len=4096, batch_size=8, dim=512, depth=12,
        steps=250000, warmup=2500, schedule="linear", min_lr_ratio=0.0, dropout=0.1, eval_every=5000, save_every="30m",
        options={"chunk_size": 2048},
    )  # fmt: skip
    _add(
        "shakespeare-bpe-tnn-600",
        "tnn LM on Shakespeare with a 4096-entry BPE, the README demo's settings with 600 steps (the demo's 10-minute budget)",
        "this library (docs/language.md)",
        model="tnn",
        tokenizer="bpe:4096",
        steps=600,
    )
    for model, overrides in SHAKESPEARE_BPE_MODELS.items():
        _add(
            f"shakespeare-bpe-{model}",
            f"{model} LM on Shakespeare with a 4096-entry BPE: the README demo's settings"
            + (f", {overrides['steps']} steps" if overrides else ""),
            "this library (docs/language.md)",
            model=model,
            tokenizer="bpe:4096",
            **overrides,
        )


_tnn_recipes()
_mega_recipes()
_transformer_recipes()
_lra_cpu_recipes()
_generated_pathfinder_recipes()
_listops_cpu_recipes()
_shapes_recipes()
_language_recipes()
