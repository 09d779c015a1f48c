"""Config resolution beyond what a JSON schema can say: the scale picked by
`auto`, the protocol numbers merged with their defaults, cross-key checks whose
messages show the arithmetic, and the per-job specs the rules pass on."""
from __future__ import annotations

import copy
import functools
import math
from pathlib import Path

import yaml

from dpscale.plan import cluster as dscluster
from dpscale import provenance, registry

SCHEMA = Path(__file__).resolve().parents[3] / "schemas" / "config.schema.yaml"
# Where the per-device locks live unless locks.dir says (dpscale.run.devices takes them).
DEFAULT_LOCK_DIR = "/tmp/dpscale-locks"


class ConfigError(ValueError):
    pass


def schema() -> dict:
    """The config schema: the caller's own copy of one parse a process (a workflow parse
    asked for it three times, 0.25 s each with the pure-Python YAML loader)."""
    return copy.deepcopy(_schema())


@functools.cache
def _schema() -> dict:
    return yaml.load(SCHEMA.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def protocol_defaults(scale: str) -> dict:
    return copy.deepcopy(schema()["properties"]["scales"]["properties"][scale]["default"])


def resolve(config: dict, fp: dict) -> dict:
    """Return the effective settings; raise ConfigError naming the key."""
    gpus = fp.get("gpu_count") or 0
    scale = config["scale"]
    if scale == "auto":
        scale = "paper" if gpus > 0 else "smoke"
    proto = protocol_defaults(scale)
    proto.update((config.get("scales") or {}).get(scale) or {})
    ks = list(config["ks"])
    for k in ks:
        if proto["global_batch"] % k:
            gb, lcm = proto["global_batch"], math.lcm(*ks)
            raise ConfigError(
                f"scales.{scale}.global_batch: {gb} is not divisible by k={k} from ks={ks} ({gb} / {k} = "
                f"{gb / k:g}), and the strong-scaling sweep splits the global batch evenly across ranks: "
                f"use ks that divide {gb}, or write 'scales={{{scale}: {{global_batch: {lcm * -(-gb // lcm)}}}}}'")
    steps = proto["train_images"] // (proto["per_rank_batch"])
    if steps < 1:
        raise ConfigError(f"scales.{scale}.train_images: {proto['train_images']} images give no full "
                          f"per-rank batch of {proto['per_rank_batch']}")
    check_tta(proto, ks, scale)
    check_replicates(proto, scale)
    tuned = config["tuned"]
    if tuned == "auto":
        tuned = gpus > 0
    extended = config.get("extended", False)
    wd = dict(config["watchdog"])
    if wd["hang_timeout_s"] == "auto":
        wd["hang_timeout_s"] = 900 if scale == "paper" else 120   # a loaded 2-core box needs the slack
    cluster = dict(config.get("cluster") or {"nodes": 1, "gpus_per_node": None})
    eff = dscluster.effective(cluster, fp)
    per_node = eff["gpus_per_node"]
    for k in ks:
        if per_node < k <= dscluster.capacity(eff) and k % per_node:
            raise ConfigError(
                f"cluster.gpus_per_node: k={k} from ks={ks} spans {-(-k // per_node)} nodes of "
                f"{per_node} devices but is not a multiple of {per_node} ({k} / {per_node} = "
                f"{k / per_node:g}); a multi-node job fills every node it uses")
    data = config["data"]
    if data["source"] == "local":
        if not data.get("local_dir"):
            raise ConfigError("data.local_dir: required when data.source is local; write "
                              "'data={source: local, local_dir: <the folder with the four Fashion-MNIST .gz files>}'")
        if not Path(data["local_dir"]).expanduser().is_dir():
            raise ConfigError(f"data.local_dir: {data['local_dir']!r} is not a folder; write "
                              "'data={source: local, local_dir: <the folder with the four Fashion-MNIST .gz files>}'")
    return {"scale": scale, "requested_scale": config["scale"], "protocol": proto, "ks": ks,
            "tuned": bool(tuned), "extended": bool(extended), "lone_k1": bool(config.get("lone_k1", False)),
            "watchdog": wd, "experiments": experiments(config["experiments"]),
            "cluster": cluster, "forecast": dict(config.get("forecast") or {}),
            "gpu_state": {"on_shared": "warn", "on_throttle": "warn", **(config.get("gpu_state") or {})}}


def check_replicates(proto: dict, scale: str) -> None:
    """A throughput point's interval needs two numbers of one kind: launches, or the
    timed repeats of its one launch (dpscale.run.launches; never pooled as if alike)."""
    if proto["launches"] < 2 and proto["repeats"] < 2:
        raise ConfigError(f"scales.{scale}.repeats: 1 timed epoch in 1 launch gives a throughput point no "
                          f"interval; write 'scales={{{scale}: {{repeats: 2}}}}' or "
                          f"'scales={{{scale}: {{launches: 2}}}}'")


def check_tta(proto: dict, ks: list[int], scale: str) -> None:
    """Time to accuracy needs one full global batch per epoch at its largest k (ks and tta_ks_emulated)."""
    if "tta_train_images" not in proto:
        return
    k = max(list(ks) + list(proto.get("tta_ks_emulated") or []))
    need = k * proto["tta_per_rank_batch"]
    if proto["tta_train_images"] < need:
        raise ConfigError(f"scales.{scale}.tta_train_images: {proto['tta_train_images']} images give no global batch "
                          f"of {need} (k={k} x tta_per_rank_batch={proto['tta_per_rank_batch']}); raise it to {need} "
                          f"or more, or lower the largest k")


def resolve_locks(config: dict, scale: str) -> dict:
    """{"dir": the lock folder, "wait_s": seconds} of the per-device locks (dpscale.run.devices).
    Not part of resolve()'s result on purpose: that is a params value of the report, and
    these must not be rerun triggers (the rules pass them as resources)."""
    locks = config.get("locks") or {}
    d = locks.get("dir") or DEFAULT_LOCK_DIR
    if not Path(d).is_absolute():
        raise ConfigError(f"locks.dir: {d!r} is relative; give an absolute path, one folder for every "
                          f"workflow folder of the host (default {DEFAULT_LOCK_DIR})")
    if Path(d).exists() and not Path(d).is_dir():
        raise ConfigError(f"locks.dir: {d!r} exists and is not a folder")
    wait = locks.get("wait_s", "auto")
    if wait == "auto":
        wait = 1800 if scale == "paper" else 300
    return {"dir": d, "wait_s": int(wait)}


def resolve_cache(config: dict, env: dict | None = None) -> dict:
    """{"dir": the absolute root of the compilation caches (dpscale.run.caches)}: cache.dir,
    else $XDG_CACHE_HOME/dpscale, else ~/.cache/dpscale. Like resolve_locks, outside
    resolve() on purpose: the rules pass it as a resource, so moving it reruns nothing."""
    d = (config.get("cache") or {}).get("dir") or provenance.user_cache(env)
    return {"dir": str(Path(d).expanduser().absolute())}


def experiments(value) -> list[str]:
    """`all`, or a list of registry names, in the registry's order."""
    if value == "all":
        return registry.names()
    unknown = [name for name in value if name not in registry.EXPERIMENTS]
    if unknown:
        raise ConfigError(f"experiments: {', '.join(map(repr, unknown))} is not an experiment; write "
                          f"experiments=all or a list of: {', '.join(registry.names())}")
    return [name for name in registry.names() if name in value]


def _coerce(value, sch: dict, defs: dict):
    if "$ref" in sch:
        sch = {**defs[sch["$ref"].split("/")[-1]], **{k: v for k, v in sch.items() if k != "$ref"}}
    types = sch.get("type")
    types = [types] if isinstance(types, str) else list(types or [])
    for alt in sch.get("oneOf", []) + sch.get("anyOf", []):
        t = alt.get("type")
        types += [t] if isinstance(t, str) else list(t or [])
    if isinstance(value, str):
        low = value.strip().lower()
        if "null" in types and low in ("null", "none", "~", ""):
            return None
        if "boolean" in types and low in ("true", "false"):
            return low == "true"
        if "integer" in types or "number" in types:
            for cast in (int, float):
                try:
                    return cast(value)
                except ValueError:
                    pass
        return value
    if isinstance(value, list) and "items" in sch:
        return [_coerce(v, sch["items"], defs) for v in value]
    if isinstance(value, dict) and "properties" in sch:
        return {k: (_coerce(v, sch["properties"][k], defs) if k in sch["properties"] else v)
                for k, v in value.items()}
    return value


def coerce_cli_types(config: dict) -> None:
    """`snakemake --config 'ks=[1,2]'` parses values inside lists and mappings with
    YAML's BaseLoader, so they arrive as strings ('1', '2'). Turn strings back into
    the numbers, booleans and nulls the schema asks for, in place; anything that
    does not parse is left for validation to reject, naming the key."""
    sch = schema()
    coerced = _coerce(config, sch, sch.get("$defs", {}))
    config.clear()
    config.update(coerced)
