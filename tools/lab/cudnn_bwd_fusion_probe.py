"""Probe (not part of the pipeline): which of MLPerf ResNet's other conv + BatchNorm fusions
does cuDNN's *Python* frontend reach on this GPU, and what does each save?
The forward statistics (conv_fprop + genstats) are in dpscale.model.fused_convbn. Here:
  fprop_prologue  relu(y*scale + bias) -> conv_fprop -> genstats   (BN apply + ReLU in the
                  next conv's input: the activation is never written)
  wgrad_prologue  conv_wgrad(image=relu(y*scale + bias), loss=dy)  (the same, for wgrad)
  dgrad_drelu     conv_dgrad -> relu_backward against relu's input recomputed from y
  dgrad_drelu_red the same, then the two BN-backward reductions sum(dt), sum(dt*y)
Each: cuDNN's support verdict, its time, the torch pieces it replaces (cuDNN conv plus a
compiled pointwise/reduction pass), and its error against torch. fp16 NHWC, batch 256.
Run on the GPU machine with the cudnn frontend importable (tools/offline-gpu/site.sh); one JSON
line per graph and shape: python tools/lab/cudnn_bwd_fusion_probe.py"""
import json
import re

import torch
import torch.nn.functional as F

torch.backends.cudnn.benchmark = True
E = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
SHAPES = [("s1", 256, 64, 64), ("s2", 256, 128, 32), ("s4", 256, 512, 8)]   # 3x3, stride 1, C -> C


def tm(f, r=30):
    for _ in range(5):
        f()
    torch.cuda.synchronize()
    E[0].record()
    for _ in range(r):
        f()
    E[1].record()
    torch.cuda.synchronize()
    return E[0].elapsed_time(E[1]) / r


def emit(**kw):
    print(json.dumps(kw), flush=True)


def rel(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30)).item()


def graph(cudnn, handle):
    f32, half = cudnn.data_type.FLOAT, cudnn.data_type.HALF
    return cudnn.pygraph(io_data_type=half, intermediate_data_type=f32, compute_data_type=f32, handle=handle)


def plan(g, cudnn):
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.B, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    return torch.empty(max(1, g.get_workspace_size()), device="cuda", dtype=torch.uint8)


def sweep(g, binds, handle, most=16):
    """Every execution plan cuDNN offers for the graph, timed: (index, ms) of those that
    build and run, so a slow verdict is the engine's, not the first plan's."""
    out = []
    for i in range(min(most, g.get_execution_plan_count())):
        try:
            g.build_plan_at_index(i)
            ws = torch.empty(max(1, g.get_workspace_size_plan_at_index(i)), device="cuda", dtype=torch.uint8)
            out.append((i, round(tm(lambda: g.execute_plan_at_index(binds, ws, i, handle=handle)), 4)))
        except Exception as e:   # a plan that does not build: the next one
            out.append((i, f"{type(e).__name__}"))
    return out


def t(g, name, x):
    return g.tensor(name=name, dim=list(x.shape), stride=list(x.stride()), data_type=_dt(x))


def _dt(x):
    import cudnn
    return {torch.float16: cudnn.data_type.HALF, torch.float32: cudnn.data_type.FLOAT}[x.dtype]


def activation(g, Y, S, B, half=False):
    """relu(y*scale + bias); half: every intermediate in fp16 (the runtime-fusion engines
    reject a two-input pointwise op whose input is fp32, as the first probe showed)."""
    import cudnn
    a = g.scale(input=Y, scale=S)
    if half:
        a.set_data_type(cudnn.data_type.HALF)
    a = g.bias(input=a, bias=B)
    if half:
        a.set_data_type(cudnn.data_type.HALF)
    a = g.relu(input=a)
    if half:
        a.set_data_type(cudnn.data_type.HALF)
    return a


def stats_out(*ts):
    import cudnn
    for T in ts:
        T.set_output(True).set_data_type(cudnn.data_type.FLOAT)


def fprop_prologue(cudnn, handle, y, sc, bi, w, half=False):
    g = graph(cudnn, handle)
    Y, S, B, W = t(g, "Y", y), t(g, "S", sc), t(g, "B", bi), t(g, "W", w)
    Z = g.conv_fprop(image=activation(g, Y, S, B, half), weight=W, padding=[1, 1], stride=[1, 1], dilation=[1, 1])
    Z.set_output(True).set_data_type(cudnn.data_type.HALF)
    SUM, SQ = g.genstats(input=Z)
    stats_out(SUM, SQ)
    ws = plan(g, cudnn)
    z = torch.empty_like(y)
    s, q = (torch.empty_like(sc) for _ in range(2))
    binds = {Y: y, S: sc, B: bi, W: w, Z: z, SUM: s, SQ: q}
    return (lambda: g.execute(binds, ws, handle=handle)), (z,)


def wgrad_prologue(cudnn, handle, y, sc, bi, dy, w, half=False):
    g = graph(cudnn, handle)
    Y, S, B, DY = t(g, "Y", y), t(g, "S", sc), t(g, "B", bi), t(g, "DY", dy)
    DW = g.conv_wgrad(image=activation(g, Y, S, B, half), loss=DY, padding=[1, 1], stride=[1, 1], dilation=[1, 1])
    DW.set_output(True).set_data_type(cudnn.data_type.FLOAT).set_dim(list(w.shape)).set_stride(list(w.stride()))
    ws = plan(g, cudnn)
    dw = torch.empty(w.shape, device="cuda", dtype=torch.float32).to(memory_format=torch.channels_last)
    binds = {Y: y, S: sc, B: bi, DY: dy, DW: dw}
    return (lambda: g.execute(binds, ws, handle=handle)), (dw,)


def dgrad_drelu(cudnn, handle, y, sc, bi, dy, w, reduce: bool):
    g = graph(cudnn, handle)
    Y, S, B, DY, W = t(g, "Y", y), t(g, "S", sc), t(g, "B", bi), t(g, "DY", dy), t(g, "W", w)
    DA = g.conv_dgrad(loss=DY, filter=W, padding=[1, 1], stride=[1, 1], dilation=[1, 1])
    DA.set_data_type(cudnn.data_type.FLOAT)
    DT = g.relu_backward(loss=DA, input=g.bias(input=g.scale(input=Y, scale=S), bias=B))
    DT.set_output(True).set_data_type(cudnn.data_type.HALF)
    dt = torch.empty_like(y)
    binds, outs = {Y: y, S: sc, B: bi, DY: dy, W: w, DT: dt}, [dt]
    if reduce:
        C = y.shape[1]
        for name, src in (("SUM_DT", DT), ("SUM_DTY", g.mul(a=DT, b=Y))):
            R = g.reduction(input=src, mode=cudnn.reduction_mode.ADD, compute_data_type=cudnn.data_type.FLOAT)
            R.set_output(True).set_data_type(cudnn.data_type.FLOAT).set_dim([1, C, 1, 1]).set_stride([C, 1, C, C])
            r = torch.zeros_like(sc)
            binds[R] = r
            outs.append(r)
    ws = plan(g, cudnn)
    run = lambda: g.execute(binds, ws, handle=handle)
    run.sweep = lambda: sweep(g, binds, handle)
    return run, tuple(outs)


def reference(y, sc, bi, dy, w):
    a = torch.relu(y.float() * sc + bi).half()
    z = F.conv2d(a, w, None, 1, 1)
    da = torch.ops.aten.convolution_backward(dy, a, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                                             [True, True, False])
    dt = torch.where(y.float() * sc + bi > 0, da[0].float(), 0.0)
    return {"z": z, "dw": da[1], "dt": dt, "sum_dt": dt.sum((0, 2, 3)), "sum_dty": (dt * y.float()).sum((0, 2, 3))}


def torch_pieces(y, sc, bi, dy, w):
    """What each graph replaces: cuDNN's conv through torch plus a compiled pass."""
    act = torch.compile(lambda y: torch.relu(y.float() * sc + bi).half().contiguous(memory_format=torch.channels_last))
    drelu = torch.compile(lambda da, y: torch.where(y.float() * sc + bi > 0, da.float(), 0.0).half())
    dred = torch.compile(lambda da, y: (lambda d: (d.half(), d.sum((0, 2, 3)), (d * y.float()).sum((0, 2, 3))))(
        torch.where(y.float() * sc + bi > 0, da.float(), 0.0)))
    a = act(y)
    da = torch.ops.aten.convolution_backward(dy, a, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                                             [True, False, False])[0]
    conv = lambda: F.conv2d(a, w, None, 1, 1)
    dgrad = lambda: torch.ops.aten.convolution_backward(dy, a, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                                                        [True, False, False])
    wgrad = lambda: torch.ops.aten.convolution_backward(dy, a, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                                                        [False, True, False])
    return {"apply_relu_ms": tm(lambda: act(y)), "conv_fprop_ms": tm(conv), "conv_dgrad_ms": tm(dgrad),
            "conv_wgrad_ms": tm(wgrad), "drelu_ms": tm(lambda: drelu(da, y)),
            "drelu_reductions_ms": tm(lambda: dred(da, y))}


def main():
    import cudnn
    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    emit(what="versions", frontend=cudnn.__version__, backend=cudnn.backend_version_string(), torch=torch.__version__)
    g = torch.Generator(device="cuda").manual_seed(0)
    for name, n, c, h in SHAPES:
        cl = dict(memory_format=torch.channels_last)
        y = torch.randn(n, c, h, h, device="cuda", generator=g).half().contiguous(**cl)
        dy = (torch.randn(n, c, h, h, device="cuda", generator=g) * 1e-2).half().contiguous(**cl)
        w = (torch.randn(c, c, 3, 3, device="cuda", generator=g) / (3 * c ** 0.5)).half().contiguous(**cl)
        sc = (1 + 0.1 * torch.randn(1, c, 1, 1, device="cuda", generator=g)).float()
        bi = (0.1 * torch.randn(1, c, 1, 1, device="cuda", generator=g)).float()
        ref = reference(y, sc, bi, dy, w)
        emit(what="torch_pieces", shape=name, **{k: round(v, 4) for k, v in torch_pieces(y, sc, bi, dy, w).items()})
        sch, bih = sc.half(), bi.half()
        cases = {"fprop_prologue": (lambda: fprop_prologue(cudnn, handle, y, sc, bi, w), ("z",)),
                 "fprop_prologue_half": (lambda: fprop_prologue(cudnn, handle, y, sch, bih, w, True), ("z",)),
                 "wgrad_prologue": (lambda: wgrad_prologue(cudnn, handle, y, sc, bi, dy, w), ("dw",)),
                 "wgrad_prologue_half": (lambda: wgrad_prologue(cudnn, handle, y, sch, bih, dy, w, True), ("dw",)),
                 "dgrad_drelu": (lambda: dgrad_drelu(cudnn, handle, y, sc, bi, dy, w, False), ("dt",)),
                 "dgrad_drelu_red": (lambda: dgrad_drelu(cudnn, handle, y, sc, bi, dy, w, True),
                                     ("dt", "sum_dt", "sum_dty"))}
        for case, (build, keys) in cases.items():
            try:
                run, outs = build()
                run()
                torch.cuda.synchronize()
                errs = {k: rel(o.flatten() if o.dim() == 4 and o.shape[0] == 1 else o, ref[k].flatten()
                               if o.dim() == 4 and o.shape[0] == 1 else ref[k]) for k, o in zip(keys, outs)}
                emit(what=case, shape=name, supported=True, ms=round(tm(run), 4), rel_err=errs,
                     plans=run.sweep() if hasattr(run, "sweep") else None)
            except Exception as e:
                emit(what=case, shape=name, supported=False, error=f"{type(e).__name__}: {e}"[:400],
                     reasons=sorted(set(re.findall(r"Reason: ([^\n]+)", str(e))))[:12])


if __name__ == "__main__":
    main()
