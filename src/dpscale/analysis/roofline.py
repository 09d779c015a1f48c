"""The roofline of one training step of the seed's ResNet-18, pass by pass.

Every pass of one step (each convolution's fprop, dgrad and wgrad; each BatchNorm's
statistics and apply passes and their backward; ReLU, the residual add, the gradient
sums where a tensor feeds two branches; the pool and linear head; the weight casts
and the SGD update) with the tensor-core FLOPs it must do and the DRAM bytes it must
move. A pass cannot beat max(FLOPs / peak, bytes / bandwidth); the step's bound is the
sum over passes. The shapes come from models.STAGES and the image size; the two rates
are measured in the same job (the bf16 matmul peak and the device copy bandwidth).

What is fused changes the bytes, not the FLOPs. Four named assumptions (FUSIONS: the
first, second and last, which the reference tables show):
  none      every BatchNorm, ReLU, add and bias add is its own pass (eager PyTorch)
  compiler  what a compiler fuses around opaque cuDNN convolutions: the bias add and
            BN-apply+ReLU(+add) in one pointwise pass, BN statistics one separate
            reduction pass, the bias gradient still its own reduction
  stats_epilogue  the tuned_fp16 series: compiler, with the biases BN cancels dropped
            and each residual block's BN statistics in its conv's forward epilogue
            (cuDNN's conv_fprop + genstats); the stem's statistics stay a pass
  ideal     BN statistics in the convolution's epilogue (forward, and the backward
            reductions in the dgrad's epilogue), one BN-apply+ReLU(+add) pass
FLOPs are what torch.utils.flop_counter counts (convolutions and the linear layer,
2 per multiply-add, no dgrad for the images); pointwise arithmetic is left out: at a
few FLOPs per element it is always bound by bytes.

Conventions (traps): activations and their gradients are bf16 (2 bytes), master weights,
their gradients and the optimizer work in fp32 (4 bytes); a 1x1 stride-2 convolution
reads a quarter of its input (channels_last: the skipped pixels are whole cache lines)
but its dgrad writes the whole input gradient, zeros included. DDP's bucket copies are
an implementation cost, not the model's, and are left out.

Pure Python: no torch, no jax (the report and the Snakefile may import it).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from dpscale.model.models import STAGES

FUSIONS = ("none", "compiler", "ideal")          # the three the reference tables show
MODELLED = FUSIONS + ("stats_epilogue",)
ACT = 2      # bytes of an activation or activation gradient element (bf16)
MASTER = 4   # bytes of an fp32 parameter, gradient element
NUM_CLASSES = 10
STEM_CHANNELS = STAGES[0][0]


@dataclass(frozen=True)
class Pass:
    layer: str        # module path in models.torch_resnet18; a block's own ReLU/add: the block
    op: str           # fprop, dgrad, wgrad, bn_stats, bn_apply, relu, ... (see Step)
    phase: str        # forward | backward | update
    flops: float      # tensor-core FLOPs
    bytes: float      # DRAM bytes read + written
    host: tuple[str, str] | None = None   # (layer, op) of the kernel whose epilogue does this

    def compute_s(self, peak_flops: float) -> float:
        return self.flops / peak_flops

    def memory_s(self, copy_Bps: float) -> float:
        return self.bytes / copy_Bps

    def bound_s(self, peak_flops: float, copy_Bps: float) -> float:
        return max(self.compute_s(peak_flops), self.memory_s(copy_Bps))

    def binds(self, peak_flops: float, copy_Bps: float) -> str:
        return "compute" if self.compute_s(peak_flops) >= self.memory_s(copy_Bps) else "memory"


@dataclass(frozen=True)
class Conv:
    name: str
    cin: int
    cout: int
    k: int
    stride: int
    h_in: int               # square input side
    input_grad: bool = True  # False for the stem: the images need no gradient

    @property
    def h_out(self) -> int:
        return self.h_in // self.stride   # 'same' padding for 3x3, none for 1x1: both halve at stride 2

    def macs_per_sample(self) -> int:
        return self.cout * self.h_out ** 2 * self.cin * self.k * self.k

    @property
    def weights(self) -> int:
        return self.cout * self.cin * self.k * self.k


@dataclass
class Step:
    """Builds the passes of one step for a batch and a fusion assumption."""
    batch: int
    fusion: str
    passes: list = field(default_factory=list)

    def add(self, layer, op, phase, nbytes, flops=0.0, host=None):
        self.passes.append(Pass(layer, op, phase, float(flops), float(nbytes), host))

    def elements(self, channels: int, side: int) -> int:
        return self.batch * channels * side * side

    def conv(self, c: Conv) -> int:
        """fprop, dgrad, wgrad and, where the fusion leaves it alone, the bias; returns
        the output's element count."""
        x, y = self.elements(c.cin, c.h_in), self.elements(c.cout, c.h_out)
        x_read = x // 4 if (c.k == 1 and c.stride == 2) else x
        flops = 2 * self.batch * c.macs_per_sample()
        self.add(c.name, "fprop", "forward", ACT * (x_read + c.weights + y), flops)
        if c.input_grad:
            self.add(c.name, "dgrad", "backward", ACT * (y + c.weights + x), flops)
        self.add(c.name, "wgrad", "backward", ACT * (y + x_read + c.weights), flops)
        if self.fusion == "none":
            self.add(c.name, "bias_add", "forward", ACT * 2 * y)    # r y, w y
        if self.fusion in ("none", "compiler") or (self.fusion == "stats_epilogue" and c.name.endswith("conv3")):
            self.add(c.name, "bias_grad", "backward", ACT * y)     # r dy: the extern conv backward's sum
        return y

    def bn_relu(self, bn: str, relu: str, n: int, consumer: tuple[str, str], residual: bool = False,
                stem: bool = False):
        """BatchNorm, then ReLU; with residual, the shortcut is added before the ReLU.
        Backward, g (the gradient of the ReLU's output z) arrives from `consumer`, the
        (layer, op) that writes it; a sum of two branches is counted apart (grad_sum)."""
        e, r = ACT * n, int(residual)
        if self.fusion == "none":
            self.add(bn, "bn_stats", "forward", e)                  # r y
            self.add(bn, "bn_apply", "forward", 2 * e)              # r y, w
            if residual:
                self.add(relu, "add", "forward", 3 * e)             # r a, r shortcut, w
            self.add(relu, "relu", "forward", 2 * e)
            self.add(relu, "relu_bwd", "backward", 3 * e)           # r g, r z, w dA
            self.add(bn, "bn_bwd_reduce", "backward", 2 * e)        # r dA, r y
            self.add(bn, "bn_bwd_apply", "backward", 3 * e)         # r dA, r y, w dy
        elif self.fusion in ("compiler", "stats_epilogue"):
            if self.fusion == "compiler" or stem:                   # else: the conv's epilogue, no bytes
                self.add(bn, "bn_stats", "forward", e)              # r y (+ bias, on the fly)
            self.add(bn, "bn_apply_relu", "forward", (2 + r) * e)   # r y (, r shortcut), w z
            # threshold_backward reads z for the mask, in the reduction and again in the
            # apply; with a shortcut the reduction writes dA (the shortcut needs it) and the
            # apply reads dA in place of g and z
            self.add(bn, "bn_relu_bwd_reduce", "backward", (3 + r) * e)   # r g, r z, r y (, w dA)
            self.add(bn, "bn_relu_bwd_apply", "backward", (4 - r) * e)    # r g, r z | r dA; r y; w dy
        else:   # ideal: the statistics come from the conv's epilogue (no bytes)
            self.add(bn, "bn_apply_relu", "forward", (2 + r) * e)   # r y (, r shortcut), w z
            # the backward reductions in the epilogue of the kernel that writes g: r y (mask
            # and x-hat from y and the statistics; with a shortcut the mask needs r z)
            self.add(bn, "bn_bwd_reduce", "backward", (1 + r) * e, host=consumer)
            self.add(bn, "bn_relu_bwd_apply", "backward", 3 * e)    # r g (or dA), r y, w dy

    def grad_sum(self, layer: str, n: int, conv1: str):
        """A block's input feeds conv1 and the shortcut, so its gradient is a sum of two.
        none: its own pass (r, r, w); compiler: fused into the pass that consumes it, which
        reads one more tensor; ideal: conv1's dgrad accumulates into the shortcut's
        gradient in its epilogue (cuDNN's beta = 1): one more read, inside that kernel."""
        if self.fusion == "none":
            self.add(layer, "grad_sum", "backward", 3 * ACT * n)
        else:
            self.add(layer, "grad_sum", "backward", ACT * n,
                     host=(conv1, "dgrad") if self.fusion == "ideal" else None)


def stem_conv(image_size: int) -> Conv:
    return Conv("0", 1, STEM_CHANNELS, 3, 1, image_size, input_grad=False)


def block_convs(image_size: int):
    """(block name, conv1, conv2, conv3 or None) for each residual block, named as in
    models.torch_resnet18 (resnet_block<i>.<j>.conv<n>)."""
    side = image_size
    for i, (cin, cout, stride) in enumerate(STAGES, 1):
        for j in range(2):
            c_in, s = (cin, stride) if j == 0 else (cout, 1)
            name = f"resnet_block{i}.{j}"
            conv1 = Conv(f"{name}.conv1", c_in, cout, 3, s, side)
            conv2 = Conv(f"{name}.conv2", cout, cout, 3, 1, side // s)
            conv3 = Conv(f"{name}.conv3", c_in, cout, 1, s, side) if s != 1 else None
            yield name, conv1, conv2, conv3
            side //= s


def all_convs(image_size: int) -> list[Conv]:
    out = [stem_conv(image_size)]
    for _, c1, c2, c3 in block_convs(image_size):
        out += [c1, c2] + ([c3] if c3 else [])
    return out


def num_params(image_size: int = 64) -> int:
    """Parameters of the network as described here (checked against the model's count)."""
    convs = all_convs(image_size)
    bn = sum(2 * c.cout for c in convs if not c.name.endswith("conv3"))
    return sum(c.weights + c.cout for c in convs) + bn + STAGES[-1][1] * NUM_CLASSES + NUM_CLASSES


def step_passes(batch: int, image_size: int, fusion: str = "ideal") -> list[Pass]:
    """Every pass of one training step (forward, backward, update) of `batch` samples."""
    if fusion not in MODELLED:
        raise ValueError(f"fusion {fusion!r} is not one of {MODELLED}")
    st = Step(batch, fusion)
    blocks = list(block_convs(image_size))
    # who writes the gradient of each BN-ReLU output: the dgrad of the conv reading it
    consumers = [(c1.name, "dgrad") for _, c1, _, _ in blocks] + [("global_avg_pool", "pool_bwd")]
    st.bn_relu("1", "2", st.conv(stem_conv(image_size)), consumers[0], stem=True)
    for (name, conv1, conv2, conv3), consumer in zip(blocks, consumers[1:]):
        st.grad_sum(name, st.elements(conv1.cin, conv1.h_in), conv1.name)
        st.bn_relu(f"{name}.bn1", name, st.conv(conv1), (conv2.name, "dgrad"))
        y2 = st.conv(conv2)
        if conv3 is not None:
            st.conv(conv3)
        st.bn_relu(f"{name}.bn2", name, y2, consumer, residual=True)
    last = blocks[-1][2]
    head(st, last.cout, last.h_out)
    update(st, num_params(image_size))
    return st.passes


def head(st: Step, channels: int, side: int):
    n = st.elements(channels, side)
    st.add("global_avg_pool", "pool", "forward", ACT * n)               # r the last activation
    st.add("global_avg_pool", "pool_bwd", "backward", ACT * n)          # w its gradient (a broadcast)
    mm = 2 * st.batch * channels * NUM_CLASSES
    w = MASTER * channels * NUM_CLASSES
    st.add("fc.1", "fprop", "forward", w, mm)
    st.add("fc.1", "dgrad", "backward", w, mm)
    st.add("fc.1", "wgrad", "backward", w, mm)


def update(st: Step, params: int):
    """autocast casts every weight to bf16 before use and each bf16 weight gradient back
    to fp32; the SGD step (no momentum) reads the weight and its gradient, writes the weight."""
    st.add("optimizer", "weight_cast", "update", (MASTER + ACT) * params)
    st.add("optimizer", "grad_cast", "update", (MASTER + ACT) * params)
    st.add("optimizer", "sgd", "update", 3 * MASTER * params)


# ---------------------------------------------------------------- bounds

def pass_bounds(passes: list[Pass], peak_flops: float, copy_Bps: float) -> list[tuple[float, str]]:
    """(bound in s, the resource that binds) of each pass. A pass done in another kernel's
    epilogue costs what its bytes add to that kernel's bound: nothing while the kernel
    stays compute-bound (then it binds 'compute'), shared by bytes among its epilogues."""
    out: list[tuple[float, str] | None] = [None] * len(passes)
    hosted: dict[tuple[str, str], list[int]] = {}
    for i, p in enumerate(passes):
        if p.host is None:
            out[i] = (p.bound_s(peak_flops, copy_Bps), p.binds(peak_flops, copy_Bps))
        else:
            hosted.setdefault(p.host, []).append(i)
    kernels = {(p.layer, p.op): p for p in passes if p.host is None and (p.layer, p.op) in hosted}
    for key, members in hosted.items():
        host = kernels[key]   # KeyError: an epilogue of a kernel the step does not have
        extra = sum(passes[i].bytes for i in members)
        together = max(host.compute_s(peak_flops), (host.bytes + extra) / copy_Bps)
        added = together - host.bound_s(peak_flops, copy_Bps)
        binds = "memory" if added > 0 else "compute"
        for i in members:
            out[i] = (added * passes[i].bytes / extra if extra else 0.0, binds)
    return out


def totals(passes: list[Pass], peak_flops: float | None = None, copy_Bps: float | None = None) -> dict:
    """FLOPs and bytes of the step and, given the rates, the bound: the sum over passes."""
    out = {"flops": sum(p.flops for p in passes), "bytes": sum(p.bytes for p in passes)}
    if peak_flops and copy_Bps:
        bounds = pass_bounds(passes, peak_flops, copy_Bps)
        out["compute_s"] = out["flops"] / peak_flops
        out["bound_s"] = sum(b for b, _ in bounds)
        out["memory_bound_s"] = sum(b for b, r in bounds if r == "memory")
    return out


def bound_samples_per_s(batch: int, image_size: int, fusion: str, peak_flops: float, copy_Bps: float) -> float:
    return batch / totals(step_passes(batch, image_size, fusion), peak_flops, copy_Bps)["bound_s"]


def per_layer(passes: list[Pass], peak_flops: float | None = None, copy_Bps: float | None = None) -> list[dict]:
    """One row per layer, in step order: FLOPs, bytes and, given the rates, the bound and
    which resource binds (the one that binds the larger share of the layer's bound)."""
    rates = bool(peak_flops and copy_Bps)
    bounds = pass_bounds(passes, peak_flops, copy_Bps) if rates else [(0.0, "")] * len(passes)
    rows: dict[str, dict] = {}
    for p, (b, binds) in zip(passes, bounds):
        r = rows.setdefault(p.layer, {"layer": p.layer, "flops": 0.0, "bytes": 0.0, "ops": [],
                                      "compute": 0.0, "memory": 0.0})
        r["flops"] += p.flops
        r["bytes"] += p.bytes
        r["ops"].append(p.op)
        if rates:
            r[binds] += b
    for r in rows.values():
        c, m = r.pop("compute"), r.pop("memory")
        if rates:
            r["bound_s"], r["binds"] = c + m, "compute" if c >= m else "memory"
    return list(rows.values())


def layer_table(batch: int, image_size: int, peak_flops: float | None, copy_Bps: float | None,
                times: dict | None = None, unmodelled: bool = True) -> list[dict]:
    """The per-layer table: each layer's FLOPs and bytes with no fusion (what eager runs)
    and with ideal fusion and, given the rates, both bounds, what binds, and, where
    `times` ({layer: {"time_ms", ...}}) has the layer, its time and the fraction of the
    unfused bound it reached. unmodelled: also the timed layers the roofline has no
    passes for (the loss). Without rates (CPU): the bytes and FLOPs only."""
    bounds = {f: {r["layer"]: r for r in per_layer(step_passes(batch, image_size, f), peak_flops, copy_Bps)}
              for f in ("none", "ideal")}
    times = times or {}
    layers = list(bounds["none"]) + ([name for name in times if name not in bounds["none"]] if unmodelled else [])
    rows = []
    for name in layers:
        none, ideal = bounds["none"].get(name, {}), bounds["ideal"].get(name, {})
        row = {"layer": name, "flops": none.get("flops", 0.0), "bytes_none": none.get("bytes", 0.0),
               "bytes_ideal": ideal.get("bytes", 0.0), **times.get(name, {})}
        if "bound_s" in none:
            row.update(bound_none_ms=1e3 * none["bound_s"], bound_ideal_ms=1e3 * ideal.get("bound_s", 0.0),
                       binds=none["binds"])
            if row.get("time_ms"):
                row["fraction_of_bound"] = row["bound_none_ms"] / row["time_ms"]
        rows.append(row)
    return rows


def roofline_fields(batch: int, image_size: int, samples_per_s_per_device: float | None,
                    peak_flops: float | None, copy_Bps: float | None) -> dict:
    """The roofline beside MFU in a tuned result (torch and JAX alike): the 'ideal'
    bound as roofline_samples_per_s, the 'compiler' one under its own name, the fraction
    of the ideal one reached, and the rates they were computed with. Without measured
    rates (CPU) only the rate-free numbers: bytes per sample under each assumption."""
    m = {"roofline_fusion": "ideal", "roofline_batch": batch}
    for fusion in ("ideal", "compiler"):
        t = totals(step_passes(batch, image_size, fusion), peak_flops, copy_Bps)
        suffix = "" if fusion == "ideal" else "_compiler"
        m[f"roofline_bytes_per_sample_MB{suffix}"] = t["bytes"] / batch / 1e6
        if "bound_s" in t:
            m[f"roofline_samples_per_s{suffix}"] = batch / t["bound_s"]
    if copy_Bps:   # the peak is mfu_fields' bf16_matmul_peak_TFLOPs
        m["copy_bandwidth_GBps"] = copy_Bps / 1e9
    if samples_per_s_per_device and "roofline_samples_per_s" in m:
        m["roofline_fraction"] = samples_per_s_per_device / m["roofline_samples_per_s"]
        m["roofline_fraction_compiler"] = samples_per_s_per_device / m["roofline_samples_per_s_compiler"]
    return m


def kind(layer: str) -> str:
    """conv | batchnorm | relu/add | other, from a torch_resnet18 module path."""
    last = layer.rsplit(".", 1)[-1]
    if layer == "0" or last.startswith("conv"):
        return "conv"
    if layer == "1" or last.startswith("bn"):
        return "batchnorm"
    if layer == "2" or (layer.startswith("resnet_block") and last.isdigit()):
        return "relu/add"
    return "other"


def by_kind(rows: list[dict]) -> dict:
    """A per-layer table's time and bounds summed per kind of layer."""
    out: dict = {}
    for r in rows:
        k = out.setdefault(kind(r["layer"]), {"time_ms": 0.0, "bound_none_ms": 0.0, "bound_ideal_ms": 0.0})
        for key in k:
            k[key] += r.get(key, 0.0)
    return out
