"""Every experiment of the pipeline, declared once.

An experiment is a name, the variants it runs in, the device counts k it runs at,
the worker family that runs it (torchrun with one process per device, or one JAX
process that sees k devices), the function that measures it, the inputs it reads,
the protocol numbers it depends on, and the report chapter that shows it. The rest
derives from this module: the measurement rules (rules/measure.smk makes one rule
per entry), the job specs and targets (specs.py), the results contract
(results.py), the workers' dispatch (entry_point), the report's plan and chapters,
and the test fixtures. The config schema, a static file Snakemake validates
against, is checked against this module by tests/test_registry.py.

Parse-time light: no torch, no jax (the Snakefile imports it on every call).
"""
from __future__ import annotations

import functools
import importlib
import json
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Callable, Mapping

FAMILIES = ("torch", "jax")

# Environment of the NCCL memcpy switch. The shared-memory transport it configures
# is only used when peer-to-peer is off, so P2P goes off with it.
MEMCPY_ENV = MappingProxyType({"NCCL_SHM_USE_CUDA_MEMCPY": "1", "NCCL_P2P_DISABLE": "1"})


@dataclass(frozen=True)
class Variant:
    name: str
    text: str                                  # what a reader sees in legends and tables
    tuned: bool = False                        # only when the config's `tuned` is on
    # A series the answer does not read (the answer, ANSWER below: time to accuracy under
    # the book's rule and DDP weak scaling of the step it trains with, the tuned one on a
    # GPU, the resize cache's elsewhere, with the strong k=1 point that gives its compute
    # line an intercept; the book's own figures: its DataLoader, JAX's host loop, FSDP):
    # an ablation, or an alternative (another LR rule, precision, or the book's loop
    # under strong scaling).
    # Planned only where the config's `extended` is true (default false: at paper each
    # costs minutes of one GPU, and at smoke they were a quarter of the 2-core quick
    # start: docs/measurements/quickstart-cost_cpu2_2026-12-03.md).
    extended: bool = False
    nccl_only: bool = False                    # a setting of NCCL itself: skipped on gloo
    env: Mapping[str, str] = field(default_factory=dict)
    extra_protocol: tuple[str, ...] = ()       # protocol keys only this variant reads
    options: Mapping[str, object] | None = None   # recorded in the spec's config.tuned
    # Below min_k the variant *is* another one (`same_below`): the linear LR rule at k=1
    # is the book's rule, so its k=1 is not run twice; the report borrows the other's.
    min_k: int = 1
    same_below: str | None = None
    # Planned at k <= max_k only (None: every k its experiment runs at): a reference run
    # that only means something at one k (the book's fp32 loop beside the tuned step at k=1).
    max_k: int | None = None
    # What the variant needs beyond the experiment's, by REQUIREMENTS key: planned
    # everywhere, skipped with the requirement's reason where the fingerprint lacks it.
    requires: tuple[str, ...] = ()
    book: bool = False                         # the book's own protocol: a report's first series
    input: str | None = None                   # how batches reach the devices (INPUT_PATHS)
    lr_scaling: str | None = None              # the LR rule over k (dpscale.analysis.tta.lr_at)
    # The training step's options where CUDA is present (torch_ddp's tuned options: bf16,
    # channels_last, compile, CUDA graph, fused SGD, the model's transformations); on a CPU
    # the same step runs without the GPU-only ones (dpscale.measure.torch_tta.step_options).
    # Planned everywhere, unlike `tuned`; None: the book's fp32 eager step everywhere.
    step: Mapping[str, object] | None = None
    # A time-to-accuracy variant's samples/s: the ddp_weak variants that run its step, the
    # first one measured taken (the tuned series where the tuned step ran; on a CPU, where
    # the step loses its GPU-only parts and tuned is not planned, the book's loop).
    rate_from: tuple[str, ...] = ()

    def meaning(self) -> dict:
        """What a worker must know of the variant beyond the protocol: carried by the spec
        (config.variant), so the numbers depend on it through the spec, not the registry."""
        out = {key: getattr(self, key) for key in ("input", "lr_scaling") if getattr(self, key) is not None}
        if self.step is not None:
            out["step"] = json.loads(json.dumps(dict(self.step)))   # plain JSON: the spec is a params value
        return out

    def runs_at(self, k: int) -> bool:
        """Whether the variant is planned at k (min_k and max_k)."""
        return k >= self.min_k and (self.max_k is None or k <= self.max_k)


# How a variant's batches reach the devices.
INPUT_PATHS = MappingProxyType({
    "loader": "torchvision's DataLoader: PIL Resize per image, per epoch (the book's)",
    "cache": "the resize cache resident on the device, sliced per step",
    "host": "float32 batches staged on the host, device_put per step (the book's loop)",
    "device": "the uint8 set resident on the devices, sliced per step",
})


SEED = Variant("seed", "the book's DataLoader (PIL resize per image, per epoch)",
               extra_protocol=("loader_workers",), book=True, input="loader")
CACHED = Variant("cached", "resize cache resident on the device", input="cache")
# The tuned DDP series: each option is on because it measured faster alone, and off
# (gradient_as_bucket_view, static_graph, the direct stem, Triton BN statistics) because
# it did not (docs/measurements/tuned-step_h200_2026-11-29.md, tuned-step_h200_2026-12-01.md).
# cuda_graph: the compiled step is host-bound on a 16-core H200 box, so the whole step
# is replayed as one graph.
TORCH_TUNED = Variant(
    "tuned", "bf16, channels_last, torch.compile, fused SGD, one CUDA graph per step", tuned=True, input="cache",
    options=MappingProxyType({"precision": "bf16", "channels_last": True, "compile": True,
                              "cuda_graph": True, "data": "device-resident cache",
                              "optimizer": "fused SGD", "ddp": (),
                              "stem": "im2col", "projection": "slice_matmul", "cancelled_bias": "drop"}))
# fp16, because on sm_90 cuDNN fuses BatchNorm's statistics into the convolution in fp16
# only (dpscale.model.fused_convbn); everything else as the tuned series. bn1's backward
# sums in conv2's dgrad as well measured slower and live in the lab
# (docs/measurements/tuned-fp16_h200_2026-12-02.md).
TORCH_TUNED_FP16 = Variant(
    "tuned_fp16", "fp16 with dynamic loss scaling, BN statistics in the conv's epilogue (cuDNN graph), else as tuned",
    tuned=True, requires=("gpu", "cudnn_frontend"), input="cache", extended=True,
    options=MappingProxyType({**TORCH_TUNED.options, "precision": "fp16", "loss_scaling": "dynamic",
                              "convbn": "cudnn_genstats"}))
# A requirement's fingerprint key, and the reason a machine without it reads.
REQUIREMENTS = MappingProxyType({
    "gpu": ("gpu_count", "needs a CUDA GPU"),
    "cudnn_frontend": ("cudnn_frontend", "needs cuDNN's Python frontend: pip install -e '.[cudnn]' "
                                         "(nvidia-cudnn-frontend; on a machine without network, carry its wheel)"),
})
HOST = Variant("host", "host-staged float32 batches, device_put per step (the book's loop)", book=True,
               input="host")
DEVICE = Variant("device", "the uint8 set resident on the devices, sliced per step", input="device", extended=True)
# precision bf16: bf16 compute, float32 parameters and loss; dispatch flat_jit: jax.jit over
# the flat nnx.split state with donated buffers, not nnx.jit (dpscale.measure.jax_weak).
JAX_TUNED = Variant(
    "tuned", "bf16 compute, data on the devices, jax.jit over the flat state", tuned=True, input="device",
    extended=True,
    options=MappingProxyType({"precision": "bf16", "data": "device-resident cache", "dispatch": "flat_jit"}))
DEFAULT = Variant("default", "NCCL's defaults (gloo without GPUs)")
MEMCPY = Variant("memcpy", "NCCL_SHM_USE_CUDA_MEMCPY=1 (and NCCL_P2P_DISABLE=1)", nccl_only=True,
                 env=MEMCPY_ENV)
# Time to accuracy: the learning-rate rule (dpscale.analysis.tta.lr_at) and the step. The
# clock is the answer, so a GPU trains with the fastest step it has, the tuned series'
# (the data is device-resident in every time-to-accuracy run); the book's own fp32 eager
# loop runs beside it at k=1 only, to show what the tuned step changes, and only on a GPU:
# a CPU runs the book's step anyway (its share of the tuned step is fp32 and eager), so
# there it is planned and skipped, and costs the smoke DAG nothing.
TTA_STEP = MappingProxyType({key: v for key, v in TORCH_TUNED.options.items() if key != "data"})
TTA_STEP_RATE = ("tuned", "cached", "seed")   # Variant.rate_from of the rules that train with TTA_STEP
TTA_BOOK = Variant("book", "SGD lr 0.1 at every global batch, no momentum (the book's loop); the tuned step on GPUs",
                   book=True, lr_scaling="constant", step=TTA_STEP, rate_from=TTA_STEP_RATE)
TTA_LINEAR = Variant("linear", "lr 0.1 x k after a linear warm-up of tta_warmup_epochs (Goyal et al. 2017); "
                               "the tuned step on GPUs",
                     extra_protocol=("tta_warmup_epochs",), min_k=2, same_below="book", lr_scaling="linear",
                     step=TTA_STEP, rate_from=TTA_STEP_RATE, extended=True)
TTA_BOOK_FP32 = Variant("book_fp32", "the book's loop as written: SGD lr 0.1, fp32, eager (k=1 only)",
                        lr_scaling="constant", max_k=1, requires=("gpu",), rate_from=("cached", "seed"), extended=True)
MEMCPY_TRAINING = Variant("default", "DDP training with NCCL_SHM_USE_CUDA_MEMCPY=1", nccl_only=True,
                          env=MEMCPY_ENV)


def every_k(ks: list[int]) -> list[int]:
    return sorted(set(ks))


def multi_k(ks: list[int]) -> list[int]:
    """k >= 2: a collective needs two devices."""
    return [k for k in every_k(ks) if k >= 2]


def book_pair(ks: list[int]) -> list[int]:
    """The book's exercises run at k=2; without a 2 in ks, at the smallest k >= 2."""
    multi = multi_k(ks)
    return [2] if 2 in multi else multi[:1]


def curve_k(ks: list[int]) -> list[int]:
    """Every k, where ks asks for a curve (some k >= 2, measured or skipped): strong
    scaling splits one global batch over k, so with ks = [1] nothing is split and its
    lone point is the weak series' loop at twice the batch, which only the strong
    forecast's compute line reads, at the cost of minutes of a GPU
    (docs/measurements/readme-run_h200_2026-12-03.md)."""
    return every_k(ks) if max(ks, default=1) >= 2 else []


def always_two(ks: list[int]) -> list[int]:
    """k=1 against k=2 inside one job: planned at k=2 whatever ks holds."""
    return [2]


KS_TEXT = {every_k: "every k", curve_k: "every k, where ks has a k >= 2", multi_k: "k >= 2", book_pair: "k = 2 (else least k >= 2)", always_two: "k = 2 (vs k = 1, one job)"}

# Inputs a measurement can read, by name; rules/common.smk maps each to its file.
INPUTS = ("raw", "cache", "meta", "flops", "tta_cache", "tta_meta")


@dataclass(frozen=True)
class Needs:
    """Another experiment's result this one reads (the comm probe prices DDP's
    buckets with the bandwidth that the k=2 all-reduce sweep measured)."""
    experiment: str
    variant: str
    k: int


@dataclass(frozen=True)
class Experiment:
    name: str
    title: str                        # one line: what it measures
    family: str                       # "torch" | "jax"
    entry: str                        # "module:function" that measures it, given the worker's Ctx
    variants: tuple[Variant, ...]
    ks: Callable[[list[int]], list[int]]
    protocol: tuple[str, ...]         # protocol numbers its result depends on
    chapter: str                      # the report chapter that shows it
    inputs: tuple[str, ...] = ("meta",)
    needs: tuple[Needs, ...] = ()
    limit_key: str | None = None      # protocol key replacing the watchdog's hang limit
    min_devices: int = 1              # JAX host devices a CPU stand-in must expose
    emulates: bool = False            # a k above the devices present runs emulated, not skipped
    extra_ks_key: str | None = None   # protocol key listing k's it runs beyond `ks` (emulated)
    # What the forecast reads of it (dpscale.report.forecast): a throughput sweep ("weak" or
    # "strong" scaling of its family), or a part of the step model ("fabric": the all-reduce
    # sweep; "overlap": the no_sync() probe; "census": the all-reduces of a compiled step).
    scaling: str | None = None
    feeds: str | None = None

    def variant_names(self, tuned: bool = True, extended: bool = True) -> list[str]:
        return [v.name for v in self.variants if (tuned or not v.tuned) and (extended or not v.extended)]

    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(f"{self.name} has no variant {name!r}; it has {self.variant_names()}")

    def protocol_for(self, variant: str) -> tuple[str, ...]:
        return self.protocol + self.variant(variant).extra_protocol

    def series_order(self, have) -> list[str]:
        """The variants of `have`, the book's protocol first, then in declaration order:
        the series a report draws first for this experiment."""
        order = sorted(self.variants, key=lambda v: not v.book)
        return [v.name for v in order if v.name in have]

    @property
    def sources(self) -> tuple[str, ...]:
        """The dpscale modules its job runs: what its family's worker and its entry
        import, found by walking the imports (dpscale.provenance). A change to what
        one of them does reruns exactly the experiments that run it."""
        return _sources(FAMILY_JOB[self.family], self.entry.partition(":")[0])


# The module of each family's worker process: it sets up the ranks or devices and
# calls the experiment's entry (scripts/torch_worker.py, scripts/jax_worker.py).
FAMILY_JOB = {"torch": "dpscale.measure.torch_job", "jax": "dpscale.measure.jax_job"}


@functools.cache
def _sources(*roots: str) -> tuple[str, ...]:
    from dpscale import provenance   # ground floor too; imported late, parse time stays light
    return provenance.closure(roots)


THROUGHPUT = ("image_size", "train_images", "epochs", "warmup_steps", "repeats")
# The keys that say only when the test set is evaluated (the protocol's cadence, on the job's
# clock; the instrument's grid, off it). An evaluation runs the network in eval mode without
# gradients: it moves no weight, running statistic or data order, so measurements that differ
# in these keys alone trained alike, and their samples to target pool (report.tta_pool).
TTA_EVALUATION = ("tta_eval_every_epochs", "tta_eval_every_samples", "tta_eval_near_every_samples",
                  "tta_eval_near_margin")
TTA = ("tta_image_size", "tta_train_images", "tta_test_images", "tta_per_rank_batch", "tta_target",
       *TTA_EVALUATION, "tta_max_epochs", "tta_seeds")
# Independent launches of a throughput point, merged by the watchdog (dpscale.run.launches).
LAUNCHED = ("launches",)


def _family(family: str):
    """The Experiment maker of one worker family; entry: "module:function" within
    dpscale.measure (torch_ddp, torch_comm, torch_fsdp; jax_weak, jax_checks)."""
    def make(name, title, entry, variants, ks, protocol, chapter, **kw) -> Experiment:
        return Experiment(name, title, family, f"dpscale.measure.{entry}", variants, ks, protocol,
                          chapter, **kw)
    return make


_torch, _jax = _family("torch"), _family("jax")


_ALL = (
    _torch("ddp_weak", "DDP samples/s with the per-rank batch fixed (weak scaling)", "torch_ddp:exp_ddp_weak",
           (SEED, CACHED, TORCH_TUNED, TORCH_TUNED_FP16), every_k, THROUGHPUT + ("per_rank_batch",) + LAUNCHED, "scaling",
           inputs=("raw", "cache", "meta", "flops"), scaling="weak"),
    _torch("ddp_strong", "DDP samples/s with the global batch fixed (strong scaling)", "torch_ddp:exp_ddp_strong",
           (replace(SEED, extended=True), CACHED, replace(TORCH_TUNED, extended=True)), curve_k,
           THROUGHPUT + ("global_batch",) + LAUNCHED, "scaling",
           inputs=("raw", "cache", "meta", "flops"), scaling="strong"),
    _torch("ddp_comm_probe", "synced against no_sync() step time, against the cost model",
           "torch_comm:exp_comm_probe", (DEFAULT,), multi_k,
           ("image_size", "per_rank_batch", "probe_warmup", "probe_pairs"), "communication",
           needs=(Needs("allreduce", "default", 2),), feeds="overlap"),
    _torch("allreduce", "bare all-reduce over a payload sweep, nccl-tests' protocol", "torch_comm:exp_allreduce",
           (DEFAULT, MEMCPY), multi_k, ("allreduce_MiB", "allreduce_warmup", "allreduce_iters"),
           "communication", feeds="fabric"),
    _torch("ddp_memcpy_training", "exercise 3: DDP training with the NCCL memcpy switch",
           "torch_ddp:exp_memcpy_training", (MEMCPY_TRAINING,), book_pair,
           THROUGHPUT + ("per_rank_batch",), "communication",
           inputs=("cache", "meta"), limit_key="memcpy_timeout_s"),
    _torch("ddp_bucket_sweep", "exercise 1: DDP throughput against bucket_cap_mb", "torch_ddp:exp_bucket_sweep",
           (DEFAULT,), book_pair, ("image_size", "per_rank_batch", "bucket_cap_MiB", "sweep_steps"),
           "communication"),
    _torch("fsdp", "FSDP2 beside DDP: training state per rank, peak memory, throughput", "torch_fsdp:exp_fsdp",
           (DEFAULT,), every_k, ("image_size", "per_rank_batch", "sweep_steps"), "memory"),
    _jax("jax_weak", "JAX data parallelism (Mesh, NamedSharding, jit): weak scaling", "jax_weak:exp_weak",
         (HOST, DEVICE, JAX_TUNED), every_k, THROUGHPUT + ("per_rank_batch",) + LAUNCHED, "jax",
         inputs=("cache", "meta", "flops"), scaling="weak"),
    _jax("jax_hlo", "the all-reduces XLA inserted into the compiled step", "jax_checks:exp_hlo", (DEFAULT,),
         multi_k, ("image_size", "train_images", "per_rank_batch"), "jax", inputs=("cache", "meta"), feeds="census"),
    _jax("jax_equality", "one step at k=1 against one step at k=2, and a broken step it must flag",
         "jax_checks:exp_equality", (DEFAULT,), always_two, ("image_size", "train_images", "per_rank_batch"), "jax",
         inputs=("cache", "meta"), min_devices=2),
    _torch("ddp_tta", "time to a test accuracy under DDP, per LR rule, MLPerf's rules (k beyond the devices: emulated)",
           "torch_tta:exp_tta", (TTA_BOOK, TTA_LINEAR, TTA_BOOK_FP32), every_k, TTA, "tta", inputs=("tta_cache", "tta_meta"),
           limit_key="tta_timeout_s", emulates=True, extra_ks_key="tta_ks_emulated"),
)
EXPERIMENTS: dict[str, Experiment] = {e.name: e for e in _ALL}


@dataclass(frozen=True)
class Answer:
    """The series the report's first screen (and the closing summary) answers with: time
    to accuracy under one experiment's variant, and the samples/s of the step that variant
    trains with, read from its `rate_from` (the first of them measured at k=1). A machine
    without a time to accuracy shows the samples/s of that same step, so every machine's
    growth is the same step's."""
    experiment: str
    variant: str

    def rule(self) -> Variant:
        return get(self.experiment).variant(self.variant)

    @property
    def rate_experiment(self) -> str:
        """The throughput experiment whose variants rate_from names: its family's weak scaling."""
        return scaling_of(get(self.experiment).family, "weak")

    @property
    def rate_from(self) -> tuple[str, ...]:
        return self.rule().rate_from


ANSWER = Answer("ddp_tta", TTA_BOOK.name)


def get(name: str) -> Experiment:
    try:
        return EXPERIMENTS[name]
    except KeyError:
        raise KeyError(f"no experiment {name!r}; the registry has {', '.join(EXPERIMENTS)}") from None


def scaling_of(family: str, scaling: str) -> str | None:
    """The throughput experiment of a family's weak or strong scaling, or None."""
    return next((e.name for e in EXPERIMENTS.values() if e.family == family and e.scaling == scaling), None)


def feeding(part: str) -> Experiment | None:
    """The experiment that measures a part of the forecast's step model."""
    return next((e for e in EXPERIMENTS.values() if e.feeds == part), None)


def names(family: str | None = None) -> list[str]:
    return [e.name for e in EXPERIMENTS.values() if family in (None, e.family)]


def variant_text(experiment: str, variant: str) -> str:
    return get(experiment).variant(variant).text


def entry_point(name: str) -> Callable:
    """The function that measures `name`: what a worker dispatches to."""
    module, _, func = get(name).entry.partition(":")
    return getattr(importlib.import_module(module), func)


def protocol_keys() -> set[str]:
    """Every protocol number some experiment reads (the schema's $defs/protocol)."""
    keys = {k for e in EXPERIMENTS.values() for k in e.protocol}
    keys |= {k for e in EXPERIMENTS.values() for v in e.variants for k in v.extra_protocol}
    keys |= {e.limit_key for e in EXPERIMENTS.values() if e.limit_key}
    keys |= {e.extra_ks_key for e in EXPERIMENTS.values() if e.extra_ks_key}
    return keys
