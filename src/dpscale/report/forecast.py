"""The forecast of every machine in a report (dpscale.analysis.forecast), computed once
per report: the chapter, its figures, forecast.json and `dpscale forecast` read the same
records. Here, and only here, results become the forecast's inputs: the registry says
which experiment is a family's weak or strong scaling and which measures the fabric, the
overlap and the all-reduce census (registry.Experiment.scaling, .feeds).

One machine, one answer: a machine's forecast is a function of its own results, the
fabric files given and the committed machines (the fixed pool the band's misfit falls
back on, misfit.py), never of what else is in the report or on the command line.

Fabric, per tier (fit.py): the user's files (`dpscale forecast --fabric`, or a configured
forecast.fabric_files) for the tiers they cover; else the machine's own all-reduce sweeps
(and its own measured link between nodes); else the schema's default files. Each series
says which source each tier took. Without a tier between nodes nothing is predicted past
one node; the grid's nodes hold as many devices as that tier was measured with.
"""
from __future__ import annotations

import json
from pathlib import Path

from dpscale import provenance, registry
from dpscale.plan import config as dsconfig
from dpscale.report.machines import Machine, ReportData
from dpscale.results import utc_now, write_json_atomic

FAMILY_TEXT = {"torch": "DDP", "jax": "JAX"}


def settings(resolved: dict | None = None, **over) -> dict:
    """The schema's `forecast` defaults, the resolved configuration's values over them."""
    props = dsconfig.schema()["properties"]["forecast"]["properties"]
    given = {**((resolved or {}).get("forecast") or {}), **{k: v for k, v in over.items() if v is not None}}
    return {**{k: v["default"] for k, v in props.items()}, **given}


def ok(r) -> bool:
    return bool(r) and r.get("status") == "ok"


def _m(r) -> dict:
    return (r or {}).get("metrics") or {}


def rate(r: dict):
    """A throughput result as the forecast's Rate: launches and timed epochs kept apart."""
    from dpscale.analysis.forecast.inputs import Rate
    m = _m(r)
    launches = tuple(tuple(x) for x in (m.get("samples_per_s_launch_repeats") or []) if x)
    return Rate(float(m["samples_per_s"]), launches if len(launches) >= 2 else (),
                tuple(m.get("samples_per_s_repeats") or ()), r.get("started_utc") or "")


def nodes_of(r: dict) -> int:
    """Nodes a measurement spanned (its spec's multi-node launch), 1 on one node."""
    return int(((r or {}).get("launch") or {}).get("nodes") or 1)


def sweep(r: dict, k: int):
    """An all-reduce result as the forecast's Sweep (in place: DDP all-reduces in place)."""
    from dpscale.analysis import costmodel
    from dpscale.analysis.forecast.inputs import Sweep
    table = costmodel.allreduce_rows(_m(r))
    rows = table.get("in_place") or table.get("out_of_place") or []
    return Sweep(tuple(float(x["bytes"]) for x in rows),
                 tuple(x.get("time_us_median", x.get("time_us")) / 1e6 for x in rows), k, nodes_of(r),
                 tuple(median_rse(x) for x in rows), r.get("_path", ""))


def median_rse(row: dict) -> float | None:
    """The relative standard error of a payload's median time over its calls: sqrt(pi/2)
    x cv / sqrt(calls) (the median of n normal draws); None where the row has no spread."""
    cv, n = row.get("time_us_cv"), row.get("iters")
    return 1.2533 * cv / n ** 0.5 if cv is not None and n else None


def parts(results: dict, family: str, params_hint: float | None) -> dict:
    """The step model's measured parts: sweeps within one node and across nodes, the
    probe's paired differences, and the payloads of one step's all-reduces."""
    fab, ovl, cen = (registry.feeding(p) for p in ("fabric", "overlap", "census"))
    fab_variant = fab.series_order(fab.variant_names())[0]
    sweeps = {k: sweep(r, k) for (e, v, k), r in sorted(results.items())
              if e == fab.name and v == fab_variant and ok(r) and k >= 2}
    one = {k: s for k, s in sweeps.items() if s.nodes == 1}
    across = [s for s in sweeps.values() if s.nodes > 1]
    probes = {k: tuple(x / 1e3 for x in (_m(r).get("comm_ms_pairs") or [_m(r).get("comm_ms")]) if x is not None)
              for (e, _v, k), r in sorted(results.items()) if e == ovl.name and ok(r) and ovl.family == family}
    stragglers = {k: tuple(_m(r).get("straggler_share_pairs") or ()) for (e, _v, k), r in sorted(results.items())
                  if e == ovl.name and ok(r) and ovl.family == family}
    census = [_m(r) for (e, _v, _k), r in sorted(results.items()) if e == cen.name and ok(r)]
    buckets, how = payloads([_m(r) for (e, _v, _k), r in sorted(results.items()) if e == ovl.name and ok(r)],
                            census, family, params_hint)
    return {"sweeps": one, "internode": max(across, key=lambda s: s.k) if across else None,
            "probes": {k: p for k, p in probes.items() if p}, "buckets": buckets, "buckets_how": how,
            "stragglers": {k: x for k, x in stragglers.items() if x}}


def payloads(probes: list[dict], census: list[dict], family: str, params_hint) -> tuple[tuple, str]:
    """One step's all-reduce payloads: XLA's (the census) for JAX, DDP's recorded buckets,
    else DDP's default bucketing of the gradient bytes (the probe's, the book's model, or
    the pipeline's ResNet-18: models.NUM_PARAMS fp32 gradients)."""
    from dpscale.analysis.forecast import model as fc
    from dpscale.model.models import NUM_PARAMS
    if family == "jax" and census and census[0].get("allreduce_elements"):
        return tuple(4.0 * x for x in census[0]["allreduce_elements"]), "XLA's all-reduces (the HLO census)"
    if family == "torch" and probes and probes[0].get("bucket_bytes"):
        return tuple(float(b) for b in probes[0]["bucket_bytes"]), "DDP's buckets (recorded by the probe)"
    grad = next((p["grad_bytes"] for p in probes if p.get("grad_bytes")), None) or 4.0 * (params_hint or NUM_PARAMS)
    return tuple(fc.ddp_buckets(grad)), f"{grad / 1e6:.1f} MB of fp32 gradients in DDP's default buckets"


def series_of(results: dict, family: str, variant: str, shared: dict):
    """The forecast's Series of one family and variant (None without k=1 throughput)."""
    from dpscale.analysis.forecast import model as fc
    from dpscale.analysis.forecast.inputs import Series
    pts = {sc: {k: r for (e, v, k), r in sorted(results.items()) if e == registry.scaling_of(family, sc)
                and v == variant and ok(r)} for sc in ("weak", "strong")}
    if 1 not in pts["weak"] and 1 not in pts["strong"]:
        return None
    weak1, strong1 = pts["weak"].get(1), pts["strong"].get(1)
    run = (weak1 or strong1).get("runtime") or {}
    pinned = family == "torch" and (weak1 or strong1).get("backend") == "gloo" and run.get("cpu_affinity")
    rows = _m(weak1 or strong1).get("per_rank") or []
    sigma = fc.sigma_from_steps((rows[0] if rows else {}).get("steps"))
    return Series(f"{FAMILY_TEXT[family]} [{variant}]",
                  float(_m(weak1).get("per_rank_batch")) if weak1 else None,
                  float(_m(strong1).get("global_batch")) if strong1 else None,
                  {k: rate(r) for k, r in pts["weak"].items()}, {k: rate(r) for k, r in pts["strong"].items()},
                  {k: nodes_of(r) for sc in pts.values() for k, r in sc.items() if nodes_of(r) > 1},
                  sigma or 0.0, "straggler sigma from k=1's step p10/p90" if sigma else
                  "no per-rank step times at k=1: straggler term 0",
                  no_overlap=(f"each gloo rank is pinned to its own {len(run['cpu_affinity'])} core(s), which its "
                              "all-reduce's threads share with its backward" if pinned else ""), **shared)


def series_list(results: dict) -> list[tuple[str, str]]:
    """(family, variant) of every series with k=1 throughput, the book's protocol first."""
    out = []
    for family in registry.FAMILIES:
        exp = registry.scaling_of(family, "weak")
        have = {v for (e, v, k), r in results.items() if e == exp and k == 1 and ok(r)}
        out += [(family, v) for v in registry.get(exp).series_order(have)]
    return out


class FabricRefused(ValueError):
    """Fabric files that give no tier this forecast can use: the message is one line."""


def given_fabric(paths, base: Path | None = None, *, explicit: bool = True, per_node: int | None = None):
    """fit.Given from fabric files: a one-host sweep gives the in-node ring, a multi-host
    one the tier between nodes (the one-host file's ring subtracted) and the layout of the
    grid's nodes. explicit: the user's files (over the machine's own tiers); else the
    schema's defaults (only where a machine measured none). per_node: the devices per node
    the user asked for (--gpus-per-node), None to take the file's. A relative path is the
    workflow's. Raises FabricRefused (one line) where the files cannot build the tiers."""
    from dpscale.analysis.forecast import fabric_file
    sweeps = [fabric_file.read_sweep(Path(p) if Path(p).is_absolute() else (base or provenance.ROOT) / p)
              for p in paths or ()]
    return given_of(sweeps, explicit=explicit, per_node=per_node)


def given_of(sweeps: list, *, explicit: bool = True, per_node: int | None = None):
    """fit.Given from sweeps read (fabric_file.read_sweep), as given_fabric. The tier between
    nodes is the multi-host sweep fitted whole (model.fit_whole): the one-host file's ring
    is not subtracted from it (that carried the in-node file's level into the tier between
    nodes, issue #54); where the two cannot be one cluster's, each machine that reads both
    is refused alone (fit.inconsistent). Two GPU models across the files: `mixed` says so."""
    from dpscale.analysis.forecast import fabric_file, fit
    one = [s for s in sweeps if s.hosts <= 1]
    multi = [s for s in sweeps if s.hosts > 1]
    _check_layout(one, multi, per_node)
    intra = fabric_file.fabric_tiers(one[0]).intra if one else None
    tiers = fabric_file.fabric_tiers(multi[0]) if multi else None
    neglected = intra is None and bool(tiers) and tiers.per_node > 1
    if neglected:
        intra = tiers.intra   # "neglected", and says so; never over a ring the machine measured
    name = (lambda s: f"{Path(s.source).name} ({s.ranks} ranks on {s.hosts} host(s)" + (f", {s.gpu}" if s.gpu else "")
            + ")")
    return fit.Given(intra, tiers.inter if tiers else None, tiers.per_node if tiers else None,
                     "; ".join(name(s) for s in one[:1] + multi[:1]), explicit,
                     name(one[0]) if one else (f"{name(multi[0])}: in-node part neglected" if intra else ""),
                     name(multi[0]) if multi else "", mixed_gpus(one[:1], multi[:1]), neglected)


def mixed_gpus(one: list, multi: list) -> str:
    """One line where the in-node file and the between-node file name different GPU models
    ("" where they name one, or a file names none)."""
    if not one or not multi or not one[0].gpu or not multi[0].gpu or one[0].gpu == multi[0].gpu:
        return ""
    a, b = one[0], multi[0]
    return (f"fabric files of two GPU models: in one node {Path(a.source).name} measures {a.gpu} ({a.ranks} per "
            f"node), between nodes {Path(b.source).name} measures {b.gpu} ({b.gpus_per_node} per node); the "
            f"forecast's nodes hold {b.gpus_per_node}, with the ring of one from the first and the tier between "
            "them from the second: a cluster that mixes them")


def _check_layout(one: list, multi: list, per_node: int | None) -> None:
    """One line of refusal where the files' layouts do not make one cluster."""
    if len(multi) > 1 or len(one) > 1:
        extra = (multi if len(multi) > 1 else one)[1]
        raise FabricRefused(f"{extra.source}: a second file for the same tier; pass one one-host file and one "
                            "multi-host file at most")
    if not multi:
        return
    m = multi[0]
    if not m.gpus_per_node:
        raise FabricRefused(f"{m.source}: its hosts hold different numbers of ranks; the tier between nodes needs "
                            "the same number on every node")
    if one and m.gpus_per_node == 1:
        raise FabricRefused(f"{m.source} measures one GPU per node, so its cluster has no in-node ring for "
                            f"{one[0].source} to give; pass one or the other")
    if per_node and per_node != m.gpus_per_node:
        raise FabricRefused(f"{m.source} measures nodes of {m.gpus_per_node} GPU(s), not the --gpus-per-node "
                            f"{per_node} asked for: the tier between nodes depends on how many GPUs share a node's "
                            f"links; drop --gpus-per-node (the forecast then takes nodes of {m.gpus_per_node}) or "
                            "pass a file measured on nodes of that size")


def default_fabric(cfg: dict):
    """The given fabric of a configuration: forecast.fabric_files, the user's where they
    differ from the schema's default, else the default (filling gaps only)."""
    default = dsconfig.schema()["properties"]["forecast"]["properties"]["fabric_files"]["default"]
    files = cfg.get("fabric_files")
    return given_fabric(files, explicit=list(files or []) != list(default))


def identity(series: list) -> str:
    """What makes two machines the same for the misfit's leave-out: their series' values."""
    import hashlib
    return hashlib.sha256(repr(series).encode()).hexdigest()[:16]


def machine_series(m: Machine) -> list[tuple[str, str, object]]:
    """(family, variant, Series) of every series of a machine with k=1 throughput."""
    hint = ((m.book or {}).get("model") or {}).get("params")
    out = []
    for family, variant in series_list(m.results):
        s = series_of(m.results, family, variant, parts(m.results, family, hint))
        if s is not None:
            out.append((family, variant, s))
    return out


def left_out(m: Machine, built: list) -> list[str]:
    """One line per result of the machine's plan that the forecast could not read (no file
    kept, or a failed one: a status other than ok or skipped): the file, and what the
    forecast did instead; those the forecast never reads, named together in one line. A
    missing input is said, never silently dropped (issue #54: DDP [tuned] vanished with
    its k=1 result and no line)."""
    from dpscale.report import tta_pool
    from dpscale.report.machines import NOT_RUN
    if m.kind == "book":
        return []
    series = {(fam, v): s for fam, v, s in built}
    fab, ovl, cen = (registry.feeding(p) for p in ("fabric", "overlap", "census"))
    out, unread = [], []
    for (e, v, k), r in sorted(m.results.items()):
        if ok(r) or r.get("status") == "skipped":
            continue
        path = r.get("_path") or f"{m.source}/{e}/{v}/k{k}.json"
        why = "no result kept" if r.get("status") == NOT_RUN else f"status {r.get('status')!r}"
        roles = [(fam, sc) for fam in registry.FAMILIES for sc in ("weak", "strong")
                 if registry.scaling_of(fam, sc) == e]
        if roles:
            fam, sc = roles[0]
            name, s = f"{FAMILY_TEXT[fam]} [{v}]", series.get((fam, v))
            if s is None:
                did = f"{name} has no k=1 throughput left, so no forecast of it"
            elif k == 1:
                did = f"{name} has no {sc} point at k=1, so its {sc} column is not forecast"
            else:
                did = f"{name} {sc} k={k} is not measured here: predicted only, no validation row at k={k}"
        elif e == fab.name and v == fab.series_order(fab.variant_names())[0]:
            did = (f"no sweep at k={k}: each series' fabric comes from the sweeps left, else a fabric file "
                   "(its 'fabric:' line says which)")
        elif e == ovl.name:
            did = (f"no probe at k={k}: the exposed fraction from a probe at another k, else from the weak step or "
                   "simulated, and DDP's buckets from another probe or the default bucketing (each row's 'from:' "
                   "and each series' 'payloads:' say which)")
        elif e == cen.name:
            did = f"no HLO census at k={k}: JAX's payloads from another census, else DDP's default bucketing " \
                  "(each series' 'payloads:' says which)"
        elif e == registry.ANSWER.experiment:
            earlier = tta_pool.earlier_paths(Path(m.source) if Path(m.source).is_absolute()
                                             else provenance.ROOT / m.source, e, v, k)
            did = (f"time to accuracy at k={k} ({v}) rests on {len(earlier)} earlier measurement(s) alone "
                   f"({', '.join(str(x.parent.parent.parent.name) for x in earlier)})" if earlier else
                   f"no time to accuracy at k={k} ({v})")
        else:
            unread.append(f"{path} ({why})")
            continue
        out.append(f"{path} ({why}): {did}")
    return out + ([f"{', '.join(unread)}: the forecast does not read {'them' if len(unread) > 1 else 'it'}"]
                  if unread else [])


_COMMITTED: dict = {}
_VALIDATION: dict = {}


def _cfg_key(cfg: dict) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in cfg.items() if k != "fabric_files"))


def validation_of(built: list, mid: str, cfg: dict) -> list[dict]:
    """Every validation row of a machine's series, before its band (check.calibrate),
    computed once per machine and settings (a fresh copy of each row each call): the
    validation never reads a fabric file (fit.Given() here says so)."""
    from dpscale.analysis.forecast import check, fit
    key = (mid, _cfg_key(cfg))
    if key not in _VALIDATION:
        _VALIDATION[key] = [r for *_, s in built for r in check.validation(s, fit.Given(), cfg)]
    return [dict(r) for r in _VALIDATION[key]]


# The band's prior: the committed machines' out-of-sample errors, declared in one file that
# `dpscale forecast --write-prior` regenerates (its rows, each machine's hardware class and
# the settings it was made at are listed there). A machine with too few rows of its own
# borrows from it, and only rows of its own hardware class: nothing measured that a CPU
# stand-in's error says anything about an H200's. A band moves only when this file does,
# never with what else is under reference/ or on the command line.
PRIOR = provenance.ROOT / "reference" / "forecast-prior.json"


def hardware_class(m: Machine) -> str:
    """'gpu' or 'cpu': the class whose prior rows a machine may borrow (the book's 4090s: gpu)."""
    return "gpu" if m.kind == "book" or (m.fingerprint or {}).get("gpu_count") else "cpu"


def prior_record(cfg: dict) -> dict:
    """The prior as `--write-prior` writes it: every validation row of the committed
    machines (reference/*/ with results, and the book), as the model's residual."""
    from dpscale.analysis.forecast import check
    from dpscale.report import book as bookmod
    from dpscale.report.machines import load_reference, reference_folders
    machines = [load_reference(p) for p in reference_folders([provenance.ROOT / "reference"])
                if (p / "runs").is_dir()]
    book = bookmod.load(bookmod.PATH) if bookmod.PATH.exists() else None
    rows = []
    for m in machines + ([book] if book else []):
        built = machine_series(m)
        mid = identity([s for *_, s in built])
        for r in validation_of(built, mid, cfg):
            res = check.residual(r, mid)
            rows.append({"machine": m.label, "class": hardware_class(m), "identity": mid, "series": res.series,
                         "scaling": res.scaling, "k": res.k, "error_log": res.error_log,
                         "noise_var": res.noise_var, "reads": sorted((list(x) for x in res.reads), key=str)})
    return {"what": "the forecast band's prior: out-of-sample errors of the committed machines (log(predicted / "
                    "measured)), borrowed only within a hardware class (dpscale.report.forecast.committed)",
            "command": "dpscale forecast --write-prior", "settings": {k: v for k, v in cfg.items()
                                                                     if k != "fabric_files"},
            "classes": {c: sorted({r["machine"] for r in rows if r["class"] == c}) for c in ("gpu", "cpu")},
            "rows": rows}


def prior_version(path=None) -> str:
    """12 hex digits of the prior file's bytes: the version a band names."""
    import hashlib
    path = path or PRIOR
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]
    except OSError:
        return "none"


def committed(cfg: dict, cls: str | None = None, path=None) -> list:
    """The declared prior's residuals of hardware class `cls` (all classes: None): the
    fixed pool a machine with too few rows of its own takes its misfit from. No file: none
    (the band is the machine's own rows alone, and says so)."""
    from dpscale.analysis.forecast.misfit import Residual
    path = path or PRIOR
    key = (str(path), prior_version(path))
    if key not in _COMMITTED:
        try:
            rows = json.loads(Path(path).read_text())["rows"]
        except (OSError, ValueError, KeyError):
            rows = []
        _COMMITTED[key] = [(r["class"], Residual(r["identity"], r["series"], r["scaling"], int(r["k"]),
                                                 float(r["error_log"]), float(r["noise_var"]),
                                                 frozenset(tuple(x) for x in r["reads"]))) for r in rows]
    return [res for c, res in _COMMITTED[key] if cls is None or c == cls]


def of_machine(m: Machine, cfg: dict, given) -> dict:
    """One machine's forecast: per series its model, grid and validation, the
    validation's summary over every row, and the verdict (which predictor did best)."""
    from dpscale.analysis.forecast import check, misfit, predict
    built = machine_series(m)
    mid = identity([s for *_, s in built])
    pool_rows = committed(cfg, hardware_class(m))
    validation = [{"machine": m.name, **r} for r in validation_of(built, mid, cfg)]
    check.calibrate(validation, mid, pool_rows, cfg)
    rows, how = misfit.pool(None, None, None, mid, [check.residual(r, mid) for r in validation], pool_rows)
    tau, nu = misfit.estimate(rows)
    series = []
    for family, variant, s in built:
        g = predict.grid(s, given, cfg, lambda _sc: (tau, nu, how))
        series.append({"series": s.name, "family": family, "variant": variant, "rows": g["rows"],
                       "tiers": g["tiers"], "per_node": g["per_node"], "layout_how": g["layout_how"],
                       "refused": g.get("refused", ""),
                       "per_rank_batch": s.per_rank_batch, "global_batch": s.global_batch,
                       "buckets_how": s.buckets_how, "knee_threshold": cfg["knee_efficiency"],
                       "misfit": tau, "misfit_rows": nu, "misfit_from": how,
                       **{f"{sc}_knee_k": predict.knee(g["rows"], f"{sc}_efficiency", cfg["knee_efficiency"])
                          for sc in predict.SCALINGS}})
    where = PRIOR.relative_to(provenance.ROOT) if PRIOR.is_relative_to(provenance.ROOT) else PRIOR
    prior = {"path": str(where), "version": prior_version(), "class": hardware_class(m),
             "rows": len(pool_rows)}
    return {"machine": m.name, "label": m.label if m.kind != "book" else "book", "kind": m.kind, "config": cfg,
            "prior": prior,
            "fabric_files": given.source, "fabric_explicit": given.explicit, "fabric_mixed": given.mixed,
            "refused": list(dict.fromkeys(x["refused"] for x in series if x["refused"])),
            "left_out": left_out(m, built), "series": series,
            "validation": validation, "summary": check.summary(validation)}


def of_machines(machines: list, cfg: dict, given) -> list[dict]:
    """Every machine's forecast, each answered alone (of_machine), in the order given."""
    return [of_machine(m, cfg, given) for m in machines]


def compute(data: ReportData) -> list[dict]:
    """Every machine's forecast, once per ReportData."""
    def every():
        cfg = settings(data.build.get("resolved"))
        given = default_fabric(cfg)
        return [of_machine(m, cfg, given) for m in data.machines]
    return data.memo("forecast", every)


def primary(f: dict, family: str = "torch") -> dict | None:
    """The series drawn for a machine: the book's protocol where measured (series_list's order)."""
    return next((s for s in f["series"] if s["family"] == family), None)


def grid_rows(forecasts: list[dict], primary_only: bool = False) -> list[dict]:
    """One row per (machine, series, k); primary_only: each machine's drawn DDP and JAX series."""
    out = []
    for f in forecasts:
        chosen = [s for s in (primary(f, fam) for fam in registry.FAMILIES) if s] if primary_only else f["series"]
        for s in chosen:
            tiers = "; ".join(f"{t}: {v}" for t, v in s.get("tiers", {}).items())
            out += [{"machine": f["machine"], "series": s["series"], "tiers": tiers,
                     **{k: v for k, v in r.items() if k != "inputs"}, "inputs": "; ".join(r.get("inputs", []))}
                    for r in s["rows"]]
    return out


def validation_rows(forecasts: list[dict]) -> list[dict]:
    """Every validation row of every machine, flat: lists joined, the reads' objects and draws dropped."""
    return [{k: ("; ".join(map(str, v)) if isinstance(v, list) else v) for k, v in r.items()
             if k not in ("used", "_log_draws")} for f in forecasts for r in f["validation"]]


def summary_rows(forecasts: list[dict]) -> list[dict]:
    """Per machine: the verdict (the predictor that did best out of sample), the
    validation's rows, mean and max |error| of the model and of the naive predictors, and
    the band's coverage."""
    out = []
    for f in forecasts:
        s = f["summary"]
        if not s["model"]["n"]:
            continue
        v = s["verdict"]
        out.append({"machine": f["machine"], "best_out_of_sample": v["winner_name"], "rows": s["model"]["n"],
                    "mean_abs_error_points": s["model"]["mean_abs"], "max_abs_error_points": s["model"]["max_abs"],
                    "inside": s["inside"], "banded": s["banded"], "coverage": s["coverage"],
                    **{f"{key}_mean_abs": s[key]["mean_abs"] for key in NAIVE_KEYS},
                    **{f"{key}_rows": v[key]["n"] if key in v else 0 for key in NAIVE_KEYS},
                    **{f"model_mean_abs_on_{key}_rows": v[key]["model_mean_abs"] if key in v else None
                       for key in NAIVE_KEYS},
                    "measured_halfwidth_max_points": s.get("measured_halfwidth_max_points"),
                    "predicted_in_measured": s.get("predicted_in_measured"),
                    "with_measured_interval": s.get("with_measured_interval")})
    return out


NAIVE_KEYS = ("naive_constant", "naive_ring", "naive_bare")


def pooled_coverage(forecasts: list[dict]) -> dict:
    """The band's coverage over every machine's rows: {inside, banded, coverage}."""
    inside = sum(f["summary"]["inside"] for f in forecasts)
    banded = sum(f["summary"]["banded"] for f in forecasts)
    return {"inside": inside, "banded": banded, "coverage": inside / banded if banded else None}


def record(forecasts: list[dict]) -> dict:
    """The forecast JSON: settings, every machine's series (grid, band, knee, tiers),
    validation, summary and verdict, and the coverage pooled over machines."""
    return {"written_utc": utc_now(), "settings": forecasts[0]["config"] if forecasts else None,
            "pooled_coverage": pooled_coverage(forecasts),
            "machines": [{**{k: v for k, v in f.items() if k not in ("validation", "config")},
                          "validation": validation_rows([f])} for f in forecasts]}


def write_prior(path=None, cfg: dict | None = None) -> dict:
    """Regenerate the declared prior from the committed machines (`dpscale forecast --write-prior`)."""
    rec = prior_record(cfg or settings(None))
    write_json_atomic(path or PRIOR, rec)
    _COMMITTED.clear()
    return rec


def write(path, forecasts: list[dict]) -> None:
    write_json_atomic(path, record(forecasts))


# ---------------------------------------------------------------- `dpscale forecast --fabric-check`

def fabric_check(folder, cfg: dict | None = None) -> dict:
    """The fabric model checked on the public outputs of folder/scales.yaml (a folder or the manifest)."""
    from dpscale.analysis.forecast import fabric_check as fk
    p = Path(folder)
    cfg = cfg or settings(None)
    return fk.run(p if p.suffix in (".yaml", ".yml") else p / "scales.yaml", level=cfg["band_level"])


def fabric_check_rows(res: dict) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in ("_draws", "rows")} for r in res["cases"]]
