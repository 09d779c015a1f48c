"""What `dpscale forecast` prints, and the pages' forecast blocks: the text of each
machine's forecast and validation, the fabric check's, the time-to-accuracy forecast's
(dpscale.report.forecast computes the records; this module only words them), and the
markdown that README.md and docs/forecast.md hold between `dpscale docs` markers."""
from __future__ import annotations

from dpscale.report.forecast import NAIVE_KEYS, fabric_check, fabric_check_rows, pooled_coverage
from dpscale.results import utc_now, write_json_atomic


# ---------------------------------------------------------------- `dpscale forecast`

def _pc(x) -> str:
    return "    –" if x is None else f"{100 * x:5.1f}"


def _band(r: dict, key: str) -> str:
    lo, hi = r.get(f"{key}_lo"), r.get(f"{key}_hi")
    return f"{_pc(r.get(key))}% [{_pc(lo)}, {_pc(hi)}]" if lo is not None else f"{_pc(r.get(key))}%{'':16}"


def _ms(x) -> str:
    return "      –" if x is None else f"{x:7.2f}"


def knee_text(s: dict, scaling: str) -> str:
    """'k=4', 'past k=128' (never below the threshold), '– (no k=1 point)' where the
    series has no throughput at k=1 to predict from (e.g. strong scaling at ks=[1]), or
    '– (why)' where no k > 1 could be predicted."""
    if not any(r.get(f"{scaling}_efficiency") is not None and r["k"] > 1 for r in s["rows"]):
        why = next((r["why_none"] for r in s["rows"] if r.get("why_none")), None)
        has_k1 = any(r["k"] == 1 and r.get(f"{scaling}_efficiency") is not None for r in s["rows"])
        return f"– ({why})" if why and has_k1 else "– (no k=1 point)"
    last = max(r["k"] for r in s["rows"] if r.get(f"{scaling}_efficiency") is not None)   # the last k forecast
    return f"k={s[f'{scaling}_knee_k']}" if s[f"{scaling}_knee_k"] else f"past k={last}"


def verdict_text(f: dict) -> str:
    """The first line about a machine's forecast: which predictor did best out of sample
    here; where a naive one did, it leads."""
    s = f["summary"]
    v = s["verdict"]
    if not s["model"]["n"]:
        return "  out of sample: nothing measured here at k >= 2 to check a prediction against"
    if v["winner"] != "model":
        w = v[v["winner"]]
        return (f"  best out of sample here: {w['name']} (naive), mean |error| {w['mean_abs']:.2f} points on its "
                f"{w['n']} rows against the model's {w['model_mean_abs']:.2f} on the same rows; read its column "
                f"('{SHORT[v['winner']]}') before the model's")
    parts = [f"{x['name']} {x['mean_abs']:.2f} (model {x['model_mean_abs']:.2f}, {x['n']} rows)"
             for key, x in v.items() if key in NAIVE_KEYS]
    return f"  best out of sample here: the model, mean |error| {s['model']['mean_abs']:.2f} points; naive: " + \
        "; ".join(parts)


SHORT = {"naive_constant": "constant", "naive_ring": "ring-scaled", "naive_bare": "bare all-reduce"}


def naive_lead(f: dict | None) -> str:
    """'' where the model did best out of sample on this machine (or nothing was checked),
    else the naive predictor that did, to lead a line about the machine's forecast."""
    v = ((f or {}).get("summary") or {}).get("verdict") or {}
    if v.get("winner", "model") == "model":
        return ""
    w = v[v["winner"]]
    return (f"out of sample {w['name']} did better here ({w['mean_abs']:.2f} against the model's "
            f"{w['model_mean_abs']:.2f} points mean |error| on its {w['n']} rows); ")


def series_text(s: dict, winner: str = "model") -> list[str]:
    tiers = "; ".join(f"{t}: {v}" for t, v in s.get("tiers", {}).items())
    lead = winner if winner != "model" else None
    out = [f"  {s['series']}: knee (< {100 * s['knee_threshold']:.0f}%) weak {knee_text(s, 'weak')}, "
           f"strong {knee_text(s, 'strong')}; payloads: {s['buckets_how']}",
           f"    fabric: {tiers or 'none'}; nodes of {s.get('per_node')} ({s.get('layout_how')}); band's misfit "
           f"{100 * (s.get('misfit') or 0):.1f}% from {s.get('misfit_from')}",
           f"    {'k':>4} {'nodes':>5} {'point':<9} " + (f"{'weak ' + SHORT[lead]:<18} " if lead else "") +
           f"{'weak efficiency [band]':<24} {'measured':>8} {'ms/step':>7}  "
           f"{'strong efficiency [band]':<24} {'measured':>8} {'ms/step':>7}"]
    over = [r["k"] for r in s["rows"] if any((r.get(f"{sc}_efficiency_hi") or 0) > 1 for sc in ("weak", "strong"))]
    if over:   # a band past 100% says why
        above = [r["k"] for r in s["rows"] if any((r.get(f"{sc}_efficiency") or 0) > 1 for sc in ("weak", "strong"))]
        out.append(f"    bands past 100% at k = {', '.join(map(str, over))}: a band is where a measurement should "
                   "fall, and one measurement's own noise reads above 100% as often as below; "
                   + (f"points predicted above 100% at k = {', '.join(map(str, above))}" if above else
                      "no point predicted is above 100%"))
    for r in s["rows"]:
        first = f"{_pc(r.get(f'weak_{lead}')):>17}% " if lead else ""
        out.append(f"    {r['k']:>4} {r['nodes']:>5} {r['point']:<9} {first}{_band(r, 'weak_efficiency'):<24} "
                   f"{_pc(r.get('weak_measured')):>7}% {_ms(r.get('weak_step_ms'))}  "
                   f"{_band(r, 'strong_efficiency'):<24} {_pc(r.get('strong_measured')):>7}% "
                   f"{_ms(r.get('strong_step_ms'))}" + (f"  ({r['why_none']})" if r.get("why_none") else ""))
    return out


def validation_text(f: dict) -> list[str]:
    if not f["validation"]:
        return ["  validation: no measured k >= 2 with a fabric to predict it from"]
    s = f["summary"]
    cov = f"{s['inside']} of {s['banded']}" if s["banded"] else "no band"
    reach = (f"; the measurement's own {100 * f['config']['band_level']:.0f}% interval: at most "
             f"+-{s['measured_halfwidth_max_points']:.1f} points, {s['predicted_in_measured']} of "
             f"{s['with_measured_interval']} predictions inside it" if s.get("with_measured_interval") else "")
    out = [f"  validation, every row: mean |error| {s['model']['mean_abs']:.1f} points, max {s['model']['max_abs']:.1f}; "
           f"band coverage {cov}; naive: constant {_pts(s['naive_constant']['mean_abs'])}, "
           f"ring-scaled overhead {_pts(s['naive_ring']['mean_abs'])}, "
           f"fully exposed all-reduce {_pts(s['naive_bare']['mean_abs'])}{reach}"]
    out += chosen_text(s)
    for r in f["validation"]:
        band = f" [{_pc(r['predicted_lo'])}, {_pc(r['predicted_hi'])}]" if r["predicted_lo"] is not None else ""
        mband = f" [{_pc(r['measured_lo'])}, {_pc(r['measured_hi'])}]" if r.get("measured_lo") is not None else ""
        out.append(f"    {r['series']} {r['scaling']:<6} k={r['k']:<3} {r['method']:<44} predicted "
                   f"{_pc(r['predicted'])}%{band}, measured {_pc(r['measured'])}%{mband}, error {r['error_points']:+.1f}; "
                   f"overhead {r['predicted_overhead_ms']:.2f} vs {r['measured_overhead_ms']:.2f} ms; naive "
                   f"{_pc(r['naive_constant'])}% / {_pc(r['naive_ring'])}% / {_pc(r['naive_bare'])}%")
        out.append(f"      from: {', '.join(r['inputs'])}; misfit {100 * r['misfit']:.1f}% ({r['misfit_from']})")
    return out


def chosen_text(s: dict) -> list[str]:
    """Per rule chosen after seeing rows: which rows may score it."""
    out = []
    for name, c in s.get("chosen_rules", {}).items():
        if c["rows"]:
            st = c["eligible_stats"]
            score = f": mean |error| {st['mean_abs']:.1f} points over them" if st["n"] else ""
            out.append(f"  rule chosen after seeing rows ({name}): {c['rows']} row(s) use it, "
                       f"{len(c['eligible'])} measured after it was chosen may score it{score}")
    return out


def _pts(x) -> str:
    return "–" if x is None else f"{x:.1f} points"


def text(forecasts: list[dict]) -> str:
    """The forecast and its validation, as `dpscale forecast` prints them."""
    cfg = forecasts[0]["config"] if forecasts else {}
    pooled = pooled_coverage(forecasts)
    lines = [f"Forecast (band: where a measurement should fall, {100 * cfg.get('band_level', 0):.0f}%, "
             f"{cfg.get('bootstrap_draws')} bootstrap draws, the model's misfit out of sample included)"]
    mixed = next((f["fabric_mixed"] for f in forecasts if f.get("fabric_mixed")), "")
    lines += [mixed] if mixed else []
    for f in forecasts:
        lines.append(f"\n== {f['machine']}" + (f"\n  fabric files ({'given' if f['fabric_explicit'] else 'default'}): "
                                               f"{f['fabric_files']}" if f["fabric_files"] else ""))
        lines.append(verdict_text(f))
        if pr := f.get("prior"):
            lines.append(f"  band's prior: {pr['path']} (version {pr['version']}), {pr['rows']} rows of class "
                         f"{pr['class']}, borrowed only where the machine has too few rows of its own")
        lines += [f"  refused past k=1: {why}" for why in f.get("refused", [])]
        lines += [f"  left out: {line}" for line in f.get("left_out", [])]
        for s in f["series"]:
            lines += series_text(s, f["summary"]["verdict"]["winner"])
        lines += validation_text(f)
    if pooled["banded"]:
        lines.append(f"\nBand coverage over every machine above: {pooled['inside']} of {pooled['banded']} "
                     f"({100 * pooled['coverage']:.0f}%) at {100 * cfg.get('band_level', 0):.0f}%")
    return "\n".join(lines)


def _pair(first: str, model, naive, fmt="{:.1f}%") -> str:
    """The two predictors' errors, the better one first (the naive one wherever it wins)."""
    m, n = f"model {fmt.format(model)}", f"naive {fmt.format(naive)}"
    return f"{n}, {m}" if first == "naive" else f"{m}, {n}"


def _ranked(model, naive, fmt="{:.1f}%") -> str:
    """_pair with the better of the two first: the smaller |error|, the model on a tie."""
    return _pair("naive" if abs(naive) < abs(model) else "model", model, naive, fmt)


def fabric_band(r: dict) -> str:
    """A case's band with its width (hi / lo) and whether the NICs cut it."""
    if r["band_lo"] is None:
        return "[no band]"
    return (f"[{r['band_lo']:.1f}, {r['band_hi']:.1f}] (x{r['band_width']:.1f} wide"
            + (", cut at the NICs" if r.get("band_bounded") else "") + ")")


def fabric_check_text(folder, json_path=None) -> str:
    """`dpscale forecast --fabric-check DIR`: per case, the larger scale's large-message
    busbw predicted from the smaller one, with its band and the band's width, beside the
    naive constant busbw; per case the mean |error| over its payloads of both predictors,
    the better first; the node-count cases' summary."""
    res = fabric_check(folder)
    lv = f"{100 * res['level']:.0f}%"
    lines = [f"Fabric check ({res['manifest']}): the larger scale's busbw at the largest payload both outputs "
             f"measured, predicted from the smaller scale [{lv} band: bootstrap over its rows, the misfit of the other "
             "clusters' cases, cut at what the nodes' NICs carry where known; its width hi/lo]; naive: the smaller "
             "scale's busbw at that payload; per case the mean |error| over its payloads, the better predictor first"]
    for r in res["cases"]:
        at = _ranked(r["error_pct"], r["naive_error_pct"], "{:+.1f}%")
        lines.append(f"  {'held out ' if r['held_out'] else ''}{r['cluster']}: {r['small_layout']} -> "
                     f"{r['large_layout']} ({r['kind']}; smaller scale read as NCCL's {r['algo'] or '?'}: "
                     f"{r['algo_why']}{'; ' + r['columns'] if r['columns'] else ''}) at {r['bytes'] / 2**20:.0f} MiB: "
                     f"measured {r['measured_busbw_GBps']:.1f} GB/s, predicted {r['predicted_busbw_GBps']:.1f} "
                     f"{fabric_band(r)}{'' if r['inside'] else ' (outside the band)'}, naive "
                     f"{r['naive_busbw_GBps']:.1f}; error {at}; mean |error| over {r['payloads']} payloads "
                     f"{_pair(r['first'], r['model_mean_abs_pct'], r['naive_mean_abs_pct'])}")
    for key, what in (("checked", "cases"), ("held_out", "held-out cases"),
                      ("nodes", "node-count cases (a cluster at N nodes predicting it at M > N)")):
        s = res["summary"][key]
        if s["cases"]:
            lines.append(f"  {what}: {s['cases']} over {s['clusters']} cluster(s), mean |error| at the largest payload "
                         f"{_pair(s['first'], s['model_mean_abs_pct'], s['naive_mean_abs_pct'])}; over payloads "
                         + _ranked(s["model_payload_mean_abs_pct"], s["naive_payload_mean_abs_pct"])
                         + f"; {s['inside']} of {s['banded']} inside the band, widths x{s['band_width_median']:.1f} "
                         f"(median) to x{s['band_width_max']:.1f}")
    if json_path:
        write_json_atomic(json_path, {"written_utc": utc_now(), **{k: v for k, v in res.items() if k != "cases"},
                                      "cases": fabric_check_rows(res)})
    return "\n".join(lines)


def _size(b: int) -> str:
    for unit, n in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= n:
            return f"{b / n:g} {unit}"
    return f"{b} B"


def fabric_markdown(folder) -> str:
    """`dpscale forecast --fabric-check DIR --markdown fabric`: docs/fabric-check.md's block,
    every case as fabric_check_text computes it: the case table and its summary, the
    node-count cases with both predictors (the better first), and every payload of every case."""
    res = fabric_check(folder)
    lv = f"{100 * res['level']:.0f}%"
    cases = list(enumerate(res["cases"], 1))
    name = lambda i, r: f"{i}{' (held out)' if r['held_out'] else ''}"  # noqa: E731
    out = ["### Every case", "",
           f"| case | cluster | from (smaller) | to (larger) | payload | measured busbw, GB/s | predicted [{lv} band] "
           "| band width (hi/lo) | error | inside | naive: smaller's busbw (error) |",
           "|---|---|---|---|---:|---:|---:|---:|---:|:---:|---:|"]
    for i, r in cases:
        band = (f"[{r['band_lo']:.1f}, {r['band_hi']:.1f}] | x{r['band_width']:.1f}"
                f"{' (cut at the NICs)' if r['band_bounded'] else ''}") if r["band_lo"] is not None else "[no band] | -"
        naive = f"{r['naive_busbw_GBps']:.1f} ({r['naive_error_pct']:+.1f}%)" if r["naive_busbw_GBps"] else "-"
        out.append(f"| {name(i, r)} | {r['cluster']} | `{r['small']}`, {r['small_layout']} | `{r['large']}`, "
                   f"{r['large_layout']} | {_size(r['bytes'])} | {r['measured_busbw_GBps']:.1f} | "
                   f"{r['predicted_busbw_GBps']:.1f} {band} | {r['error_pct']:+.1f}% | "
                   f"{'yes' if r['inside'] else 'no'} | {naive} |")
    s, h = res["summary"]["checked"], res["summary"]["held_out"]
    out += ["", f"Over the {s['cases']} cases ({s['clusters']} clusters): mean |error| of the model "
            f"{s['model_mean_abs_pct']:.1f}%, of the naive busbw {s['naive_mean_abs_pct']:.1f}%; {s['inside']} of "
            f"{s['banded']} inside their band. Over the {h['cases']} held-out cases: model "
            f"{h['model_mean_abs_pct']:.1f}%, naive {h['naive_mean_abs_pct']:.1f}%; {h['inside']} of {h['banded']} "
            f"inside. Band widths (hi/lo): x{s['band_width_median']:.1f} median, x{s['band_width_max']:.1f} at most "
            "(checked cases).", "",
            "### The node-count cases, both predictors per case", "",
            "A node-count case is one cluster's output at N nodes predicting the same nodes at M > N. In each "
            "cell the predictor with the smaller error comes first: the naive constant busbw wherever it wins. "
            "Both errors are of busbw (predicted / measured - 1).", "",
            "| case | from -> to | smaller scale read as | largest payload: error | every payload: mean abs error |",
            "|---|---|---|---|---|"]
    nodes = [(i, r) for i, r in cases if r["kind"] == "nodes"]
    for j, (i, r) in enumerate(nodes, 1):
        out.append(f"| n{j} | case {name(i, r)}: {r['small_layout']} -> {r['large_layout']} | NCCL's {r['algo'] or '?'}: "
                   f"{r['algo_why']}{'; ' + r['columns'] if r['columns'] else ''} | "
                   f"{_ranked(r['error_pct'], r['naive_error_pct'], '{:+.1f}%')} | "
                   f"{_pair(r['first'], r['model_mean_abs_pct'], r['naive_mean_abs_pct'])} over {r['payloads']} |")
    n = res["summary"]["nodes"]
    if n["cases"]:
        out += ["", f"Over the {n['cases']} node-count cases of {n['clusters']} clusters: mean |error| at the largest "
                f"payload {_pair(n['first'], n['model_mean_abs_pct'], n['naive_mean_abs_pct'])}; over every payload "
                + _ranked(n["model_payload_mean_abs_pct"], n["naive_payload_mean_abs_pct"]) + "."]
    out += ["", "### Every payload of every case"]
    for i, r in cases:
        out += ["", f"Case {name(i, r)}: `{r['small']}` -> `{r['large']}`; misfit {r['misfit']:.2f} (log) from "
                f"{r['misfit_cases']} cases; tiers: {r['tiers']}", "",
                "| payload | measured time, us | predicted, us | error of busbw | measured busbw | predicted busbw "
                "| naive busbw (error) |", "|---:|---:|---:|---:|---:|---:|---:|"]
        for x in r["rows"]:
            naive = f"{x['naive_busbw_GBps']:.2f} ({x['naive_error_pct']:+.1f}%)" if x["naive_busbw_GBps"] else "-"
            out.append(f"| {_size(x['bytes'])} | {1e6 * x['measured_s']:.1f} | {1e6 * x['predicted_s']:.1f} | "
                       f"{x['error_pct']:+.1f}% | {x['measured_busbw_GBps']:.2f} | {x['predicted_busbw_GBps']:.2f} | "
                       f"{naive} |")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- `dpscale forecast`: time to accuracy

def _tta_row(r: dict, t: dict | None, n: int) -> str:
    iv = (lambda lo, hi, f: f"[{f(lo)}, {f(hi)}]" if lo is not None and hi is not None else "")
    f1, f2 = (lambda x: f"{x:.1f}"), (lambda x: f"{x:.2f}")
    time = f"{r['time_s']:7.1f} {iv(r['time_s_lo'], r['time_s_hi'], f1):<14}" if r["time_s"] is not None else \
        f"{'–':>7} {'':<14}"
    sp = f"{r['speedup']:5.2f}x {iv(r['speedup_lo'], r['speedup_hi'], f2):<13}" if r["speedup"] is not None else \
        f"{'–':>6} {'':<13}"
    tr = f"{t['speedup']:5.2f}x" if t and t.get("speedup") is not None else f"{'–':>6}"
    sps = f"{r['samples_per_s']:9,.0f}" if r["samples_per_s"] is not None else f"{'–':>9}"
    return (f"    {r['k']:>4} {r['global_batch']:>6} {r['samples'] / n:6.2f} {iv(r['samples_lo'] / n, r['samples_hi'] / n, f2):<14}"
            f" {r['samples_input']:<9} {sps} {r['samples_per_s_input']:<30} {time} {sp} {tr}"
            + (f"  p_fastest {r['p_fastest']:.2f}" if r.get("p_fastest") else ""))


def tta_text(machines: list, forecasts: list[dict]) -> str:
    """The time-to-accuracy forecast beside the throughput one (dpscale.report.tta): per
    machine with a ddp_tta result, predicted epochs to target, samples/s, time to accuracy
    and its speed-up over k=1 (evaluation on the clock, and training only), with bands."""
    from dpscale.report import tta
    by = {f["machine"]: f for f in forecasts}
    lines = ["\nTime to accuracy (samples to target from the E(B) fit over seeds / samples/s; bands joint, 95% "
             "over seeds and the throughput's band as given)"]
    for m in (m for m in machines if m.kind != "book"):
        rec = tta.of_machine(m, by.get(m.name))
        for rule in rec["rules"].values():
            f, n = rule["forecast"], rule["train_images"] or 1
            lines.append(f"\n== {m.name}, {rule['rule']} LR, target {rule['target']:.0%}")
            if not f:
                lines.append(f"  no forecast: {rule['fit_note'] or 'no samples/s at any k'}")
                continue
            fit, ms = rule["fit"], rule["models"]
            c = f["clock"]
            choice = (f"soonest k={c['fastest_k']}, fewest GPU-hours k={c['cheapest_k']} (evaluation on the clock)"
                      if c["fastest_k"] is not None else f"no soonest k named: {c.get('no_choice_reason') or 'nothing timed'}")
            lines.append(f"  E(B) fit: E_min {fit['E_min']['value'] / n:.2f} epochs, B_crit {fit['B_crit']['value']:.0f} "
                         f"samples; {choice}")
            lines.append("  models: " + ", ".join(f"{name} {w:.0%}" for name, w in f["clock"]["models"].items())
                         + f" ({ms['method']})")
            lines.append(f"    {'k':>4} {'batch':>6} {'epochs [95%]':<21} {'samples':<9} {'samples/s':>9} "
                         f"{'from':<30} {'time s [band]':<22} {'speed-up [band]':<20} {'training only'}")
            lines += [_tta_row(r, tta.forecast_row(rule, r["k"], "train"), n) for r in f["clock"]["rows"]]
            lines += [f"  out of sample ({h['check']}): k={h['k']} from k = {', '.join(map(str, h['from_ks']))}: "
                      f"predicted {h['predicted_epochs']:.2f} epochs (line {h['line_epochs']:.2f}, power law "
                      f"{h['power_epochs']:.2f}), measured " + (f"{h['measured_epochs']:.2f}, inside the band: "
                      f"{h['inside_band']}" if h.get("measured_epochs") is not None else
                      f"none ({h.get('censored_n')} seed(s) not at the target)") for h in rule["holdout"]
                      if h.get("predicted_epochs") is not None]
    return "\n".join(lines)


# ---------------------------------------------------------------- the pages' blocks (`dpscale docs`)

NAIVE_WORDS = {"naive_constant": "the efficiency at the largest smaller k", "naive_ring": "the ring-scaled overhead",
               "naive_bare": "the fully exposed all-reduce"}


def _p1(x) -> str:
    return f"{100 * x:.1f}%"


def summary_markdown(forecasts: list[dict], fabric_folder) -> str:
    """README.md's forecast block: the band's pooled coverage, each machine where a naive
    predictor did better (it leads), the per-machine table, and the fabric check's figures."""
    cfg, p = forecasts[0]["config"], pooled_coverage(forecasts)
    lines = [f"Per machine, mean |error| in points; the band is {100 * cfg['band_level']:.0f}%, "
             f"{cfg['bootstrap_draws']} bootstrap draws. Pooled over the machines, {p['inside']} of {p['banded']} "
             f"rows fall inside their band ({100 * (p['coverage'] or 0):.0f}%)."]
    lost = []
    for f in forecasts:
        v = f["summary"]["verdict"]
        if f["summary"]["model"]["n"] and v["winner"] != "model":
            w = v[v["winner"]]
            lost.append(f"on {f['label']}, {NAIVE_WORDS[v['winner']]} did better out of sample ({w['mean_abs']:.2f} "
                        f"against the model's {w['model_mean_abs']:.2f} points mean |error| on its {w['n']} rows)")
    if lost:
        lines.append("Where a naive predictor did better, `dpscale forecast`, the report and its summary lead with it: "
                     + "; ".join(lost) + ".")
    lines += ["", "| machine | rows | model: mean / max error | inside the band | constant | ring-scaled | "
                  "fully exposed all-reduce | best out of sample |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    for f in forecasts:
        s, v = f["summary"], f["summary"]["verdict"]
        if not s["model"]["n"]:
            lines.append(f"| {f['label']} | 0 | – | – | – | – | – | nothing measured at k >= 2 |")
            continue

        def nv(key):
            return "–" if key not in v else f"{v[key]['mean_abs']:.2f} on {v[key]['n']} (model {v[key]['model_mean_abs']:.2f})"
        best = "the model" if v["winner"] == "model" else f"**{NAIVE_WORDS[v['winner']]}**"
        lines.append(f"| {f['label']} | {s['model']['n']} | {s['model']['mean_abs']:.1f} / {s['model']['max_abs']:.1f} | "
                     f"{s['inside']} of {s['banded']} | {nv('naive_constant')} | {nv('naive_ring')} | {nv('naive_bare')} "
                     f"| {best} |")
    res = fabric_check(fabric_folder)["summary"]
    lines += ["", "The fabric model on public `all_reduce_perf` outputs of one cluster at two scales, the larger "
                  "predicted from the smaller (busbw at the largest payload; mean |error|, the better predictor first):"]
    for key, what in (("checked", "cases"), ("held_out", "cases kept back"),
                      ("nodes", "node-count cases (N nodes predicting M > N)")):
        s = res[key]
        if s["cases"]:
            over = _ranked(s["model_payload_mean_abs_pct"], s["naive_payload_mean_abs_pct"])
            lines.append(f"- {s['cases']} {what} of {s['clusters']} cluster(s): "
                         f"{_pair(s['first'], s['model_mean_abs_pct'], s['naive_mean_abs_pct'])}; over every payload "
                         f"{over}; {s['inside']} of {s['banded']} inside the band, x{s['band_width_median']:.1f} "
                         f"(median) to x{s['band_width_max']:.1f} wide.")
    return "\n".join(lines) + "\n"


def validation_markdown(forecasts: list[dict]) -> str:
    """docs/forecast.md's block: every validation row of every machine."""
    lines = ["| machine | point | predicted from | predicted [band] | measured [its own interval] | error, points | "
             "misfit (from) | naive: constant / ring-scaled / fully exposed |", "|---|---|---|---|---|---:|---|---|"]
    for f in forecasts:
        for r in f["validation"]:
            point = f"{r['series']} {r['scaling']} k={r['k']}" + (f", {r['nodes']} nodes of 1" if r["nodes"] > 1 else "")
            meas = _p1(r["measured"]) + (f" [{100 * r['measured_lo']:.1f}, {100 * r['measured_hi']:.1f}]"
                                         if r.get("measured_lo") is not None else "")
            band = (f" [{100 * r['predicted_lo']:.1f}, {100 * r['predicted_hi']:.1f}]"
                    if r.get("predicted_lo") is not None else "")
            naive = " / ".join("–" if r[k] is None else _p1(r[k]) for k in NAIVE_KEYS)
            src = "own rows" if r["misfit_from"].startswith("this machine") else "pooled"
            lines.append(f"| {f['label']} | {point} | {r['method']} | {_p1(r['predicted'])}{band} | {meas} | "
                         f"{r['error_points']:+.1f} | {100 * r['misfit']:.1f}% ({src}) | {naive} |")
    return "\n".join(lines) + "\n"
