"""BatchNorm's backward reductions in the epilogue of the next convolution's dgrad: the
backward half of conv + BN fusion, for each residual block's bn1 (conv1 -> bn1 -> ReLU
-> conv2). The forward half is dpscale.model.fused_convbn.

In a block, a = relu(t), t = y * scale + shift, where y is conv1's output and scale,
shift are bn1's per-channel affine from the batch statistics. conv2's backward turns
its output gradient g into dL/da (dgrad); BN's backward then needs dt = dL/da * [t > 0]
and two per-channel sums, sum(dt) and sum(dt * y), which inductor does as a reduction
pass over dL/da and y. Here one cuDNN graph does all of it: conv_dgrad, then ReLU's
backward against t recomputed from y in the epilogue, then the two sums
(`dpscale::dgrad_drelu_dbn`). Alone, against the dgrad plus a compiled pass, it is
faster; in the model it loses, because inductor had already folded part of that work
into passes it needs anyway (docs/measurements/tuned-fp16_h200_2026-12-02.md). So it lives here, applied by
the probes (dpscale.lab.model_options), and no pipeline variant selects it.

The pieces:
  - `dpscale::dgrad_drelu_dbn(g, w, y, scale, shift, stride, padding) -> (dt, sum_dt,
    sum_dt_y)`: the graph on CUDA, planned once per shape with the fastest of cuDNN's
    plans (timed, as cudnn.benchmark does); torch's dgrad and sums elsewhere.
  - `dpscale::bnrelu_conv_genstats(a, y, scale, shift, w, ...)`: conv + statistics of
    a = relu(y * scale + shift), whose gradient goes to y, scale and shift through the
    op above (dL/dy = dt * scale, dL/dscale = sum(dt * y), dL/dshift = sum(dt)) and to w
    through the wgrad of a. The caller passes a, which it has computed anyway (inductor
    fuses it with bn1's apply): on CUDA the conv reads it; the reference recomputes it
    from y, so gradcheck sees the op's real function.
  - `DbnResidual`: a residual block whose training forward runs the two ops; eval mode
    and the parameter names are fused_convbn's.
Why by hand: as fused_convbn's; and cuDNN's own dBN node (dbn_weight) is C++ only.
"""
from __future__ import annotations

import functools

import torch
from torch import nn
from torch.nn import functional as F

from dpscale.model import fused_convbn as fc

CL = torch.channels_last
PLANS_TIMED = 8


def _c11(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(1, -1, 1, 1)


# ---------------------------------------------------------------- the dgrad graph

def _build(g, cudnn, T, stride, padding):
    f32, half = cudnn.data_type.FLOAT, cudnn.data_type.HALF
    da = g.conv_dgrad(loss=T["G"], filter=T["W"], padding=list(padding), stride=list(stride), dilation=[1, 1])
    da.set_data_type(f32)
    dt = g.relu_backward(loss=da, input=g.bias(input=g.scale(input=T["Y"], scale=T["S"]), bias=T["B"]))
    dt.set_output(True).set_data_type(half)
    c = T["S"].get_dim()[1]
    sums = [g.reduction(input=src, mode=cudnn.reduction_mode.ADD, compute_data_type=f32)
            for src in (dt, g.mul(a=dt, b=T["Y"]))]
    for r in sums:
        r.set_output(True).set_data_type(f32).set_dim([1, c, 1, 1]).set_stride([c, 1, c, c])
    return {"DT": dt, "SUM_DT": sums[0], "SUM_DTY": sums[1]}


@functools.cache
def _graph(device_index: int, shapes: tuple, stride: tuple, padding: tuple):
    """The graph for these (shape, stride) of G, W, Y, S, B, its plan the fastest of the
    first PLANS_TIMED cuDNN offers; returns (graph, tensors by name, workspace bytes)."""
    import cudnn
    f32, half = cudnn.data_type.FLOAT, cudnn.data_type.HALF
    g = cudnn.pygraph(io_data_type=half, intermediate_data_type=f32, compute_data_type=f32,
                      handle=fc.cudnn_handle(device_index))
    T = {name: g.tensor(name=name, dim=list(dim), stride=list(st), data_type=half if name in "GWY" else f32)
         for name, (dim, st) in zip("GWYSB", shapes)}
    T.update(_build(g, cudnn, T, stride, padding))
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.B, cudnn.heur_mode.FALLBACK])
    g.check_support()
    best = _fastest_plan(g, T, shapes, device_index)
    g.build_plan_at_index(best)   # selects it: execute() and get_workspace_size() now mean this plan
    return g, T, g.get_workspace_size()


def _fastest_plan(g, T, shapes, device_index) -> int:
    """Time each plan that builds on scratch tensors of the graph's shapes; the first one
    while a CUDA graph is being captured (no synchronising there; a shape first seen in a
    capture is a caller's bug anyway, the eager warm-up steps plan every shape)."""
    dev = torch.device("cuda", device_index)
    if torch.cuda.is_current_stream_capturing():
        g.build_plans()
        return 0
    data = {n: torch.randn(d, device=dev).to(torch.float16 if n in "GWY" else torch.float32).as_strided(d, s)
            for n, (d, s) in zip("GWYSB", shapes)}
    data.update(DT=torch.empty_like(data["Y"]), SUM_DT=_c11(torch.empty_like(data["S"])),
                SUM_DTY=_c11(torch.empty_like(data["S"])))
    pack = {T[n]: t for n, t in data.items()}
    import cudnn
    cudnn.set_stream(handle=fc.cudnn_handle(device_index), stream=torch.cuda.current_stream(dev).cuda_stream)
    times = {}
    for i in range(min(PLANS_TIMED, g.get_execution_plan_count())):
        try:
            g.build_plan_at_index(i)
            ws = torch.empty(max(1, g.get_workspace_size_plan_at_index(i)), dtype=torch.uint8, device=dev)
            times[i] = _time(lambda: g.execute_plan_at_index(pack, ws, i, handle=fc.cudnn_handle(device_index)))
        except Exception:   # a plan that does not build or run here: the next one
            continue
    if not times:
        raise RuntimeError(f"dpscale::dgrad_drelu_dbn: no cuDNN plan runs for shapes {shapes}")
    return min(times, key=times.get)


def _time(run, reps: int = 5) -> float:
    """CUDA-event time of `reps` runs after one warm-up (analysis.timing.StepTimer does
    this too, but the model layer sits below analysis and may not import it)."""
    run()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


# ---------------------------------------------------------------- op 1: dgrad + dReLU + dBN sums

@torch.library.custom_op("dpscale::dgrad_drelu_dbn", mutates_args=())
def dgrad_drelu_dbn(g: torch.Tensor, w: torch.Tensor, y: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor,
                    stride: list[int], padding: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The reference: dL/da, the input gradient of a conv with weight w and output
    gradient g, whose input a = relu(y * scale + shift) has y's shape; then dt = dL/da
    where y * scale + shift > 0, else 0; and the per-channel sums of dt and dt * y."""
    acc = fc.acc_dtype(y)
    da = torch.ops.aten.convolution_backward(g, y, w, None, stride, padding, [1, 1], False, [0, 0], 1,
                                             [True, False, False])[0]
    dt = torch.where(y.to(acc) * _c11(scale) + _c11(shift) > 0, da.to(acc), 0)
    return (dt.to(y.dtype).contiguous(memory_format=CL), dt.sum(fc.STATS_DIMS),
            (dt * y.to(acc)).sum(fc.STATS_DIMS))


@dgrad_drelu_dbn.register_kernel("cuda")
def _dgrad_drelu_dbn_cuda(g, w, y, scale, shift, stride, padding):
    import cudnn
    if not g.dtype == w.dtype == y.dtype == fc.DTYPE:
        raise TypeError(f"dpscale::dgrad_drelu_dbn runs in {fc.DTYPE} on CUDA, got {g.dtype}, {w.dtype}, {y.dtype}")
    g, w, y = (t.contiguous(memory_format=CL) for t in (g, w, y))
    s, b = _c11(scale.float().contiguous()), _c11(shift.float().contiguous())
    dev = y.device.index if y.device.index is not None else torch.cuda.current_device()
    shapes = tuple((tuple(t.shape), tuple(t.stride())) for t in (g, w, y, s, b))
    graph, T, ws_bytes = _graph(dev, shapes, tuple(stride), tuple(padding))
    dt, sdt, sdty = _dgrad_outputs(y)
    ws = torch.empty(max(1, ws_bytes), dtype=torch.uint8, device=y.device)
    handle = fc.cudnn_handle(dev)
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream(y.device).cuda_stream)   # fused_convbn's trap
    graph.execute({T["G"]: g, T["W"]: w, T["Y"]: y, T["S"]: s, T["B"]: b, T["DT"]: dt,
                   T["SUM_DT"]: _c11(sdt), T["SUM_DTY"]: _c11(sdty)}, ws, handle=handle)
    return dt, sdt, sdty


def _dgrad_outputs(y):
    c = y.shape[1]
    # the sums start at zero: whether cuDNN's reduction overwrites or adds is not documented
    return (torch.empty_like(y, memory_format=CL), y.new_zeros((c,), dtype=fc.acc_dtype(y)),
            y.new_zeros((c,), dtype=fc.acc_dtype(y)))


@dgrad_drelu_dbn.register_fake
def _dgrad_drelu_dbn_fake(g, w, y, scale, shift, stride, padding):
    return _dgrad_outputs(y)


# ---------------------------------------------------------------- op 2: conv + statistics of relu(BN(y))

@torch.library.custom_op("dpscale::bnrelu_conv_genstats", mutates_args=())
def bnrelu_conv_genstats(a: torch.Tensor, y: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor,
                         w: torch.Tensor, stride: list[int], padding: list[int]) \
        -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The reference: conv_genstats of relu(y * scale + shift), recomputed (a unused)."""
    acc = fc.acc_dtype(y)
    a = torch.relu(y.to(acc) * _c11(scale) + _c11(shift)).to(y.dtype).contiguous(memory_format=CL)
    return tuple(fc.conv_genstats(a, w, stride, padding))


@bnrelu_conv_genstats.register_kernel("cuda")
def _bnrelu_conv_genstats_cuda(a, y, scale, shift, w, stride, padding):
    return tuple(fc.conv_genstats(a, w, stride, padding))


@bnrelu_conv_genstats.register_fake
def _bnrelu_conv_genstats_fake(a, y, scale, shift, w, stride, padding):
    return fc.empty_outputs(a, w, stride, padding)


def _setup(ctx, inputs, output):
    a, y, scale, shift, w, stride, padding = inputs
    ctx.save_for_backward(a, y, scale, shift, w, output[0])
    ctx.stride, ctx.padding = list(stride), list(padding)


def _backward(ctx, gz, gsum, gsq):
    a, y, scale, shift, w, z = ctx.saved_tensors
    g = fc.stats_grad(z, gz, gsum, gsq)
    dt, sdt, sdty = dgrad_drelu_dbn(g, w, y, scale, shift, ctx.stride, ctx.padding)
    dw = torch.ops.aten.convolution_backward(g, a, w, None, ctx.stride, ctx.padding, [1, 1], False, [0, 0], 1,
                                             [False, True, False])[1]
    dy = (dt.to(fc.acc_dtype(y)) * _c11(scale)).to(y.dtype)
    return None, dy, sdty.to(scale.dtype), sdt.to(shift.dtype), dw, None, None


bnrelu_conv_genstats.register_autograd(_backward, setup_context=_setup)


# ---------------------------------------------------------------- the block

class DbnResidual(nn.Module):
    """models.torch_resnet18's residual block with both conv -> BN pairs fused forward
    (fused_convbn.GenstatsConvBN) and bn1's backward in conv2's dgrad (the ops above)."""

    def __init__(self, block: nn.Module):
        super().__init__()
        fc.fuse([block])   # the forward half, as the cudnn_genstats option has it
        self.conv1, self.conv2, self.conv3, self.bn1, self.bn2 = (
            block.conv1, block.conv2, block.conv3, block.bn1, block.bn2)

    def forward(self, x):
        shortcut = self.conv3(x) if self.conv3 is not None else x
        if not self.training:
            return F.relu(self.conv2(F.relu(self.conv1(x))) + shortcut)
        c1, c2 = self.conv1, self.conv2
        dtype = fc.DTYPE if x.is_cuda else x.dtype
        y, s, q = fc.conv_genstats(x.to(dtype), c1.weight.to(dtype), c1.stride, c1.padding)
        t, scale, shift = fc.bn_train(y, s, q, c1.bn)
        a = F.relu(t).detach()   # the op takes the gradient to y, scale and shift itself
        z, s2, q2 = bnrelu_conv_genstats(a, y, scale, shift, c2.weight.to(dtype), c2.stride, c2.padding)
        return F.relu(fc.batch_norm_from_sums(z, s2, q2, c2.bn) + shortcut)


def fuse(model: nn.Module, blocks: list[nn.Module]) -> None:
    """Every one of these residual blocks replaced by a DbnResidual, in place."""
    wanted = {id(b) for b in blocks}
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if id(child) in wanted:
                setattr(parent, name, DbnResidual(child))
