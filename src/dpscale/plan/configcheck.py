"""Bad configuration in one line: the key, what is wrong with the value, and what to
write instead, in the notation `snakemake --config` accepts (nested keys as a YAML
mapping: 'data={source: download}'; Snakemake's parser rejects data.source=...).

jsonschema finds the errors (the schema is the one Snakemake validates against);
this module only words them. Snakemake's own validate() then fills in the defaults.
"""
from __future__ import annotations

import jsonschema
import yaml

from dpscale.plan.config import ConfigError, schema

TYPE_WORDS = {"array": "a list", "integer": "a whole number", "number": "a number", "string": "text",
              "boolean": "true or false", "object": "a mapping", "null": "null"}


def flow(value) -> str:
    """A value in YAML flow style, as --config takes it: [1, 2], {source: local}, true."""
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()


def cli(path: list, value) -> str:
    """`snakemake --config` text that sets the key at `path` to `value`."""
    keys = [p for p in path if isinstance(p, str)]
    inner = flow(value)
    for key in reversed(keys[1:]):
        inner = f"{{{key}: {inner}}}"
    text = f"{keys[0]}={inner}"
    return f"'{text}'" if any(c in text for c in " {}[]*") else text


def _sub(node: dict, path: list) -> dict:
    """The schema of the key at `path` (object properties only)."""
    for p in path:
        if isinstance(p, int):
            node = node.get("items", {})
        else:
            node = node.get("properties", {}).get(p) or {}
            if "$ref" in node:
                node = {**schema()["$defs"][node["$ref"].rsplit("/", 1)[1]], **node}
    return node


def _allowed(alternatives: list[dict]) -> str:
    words = []
    for alt in alternatives:
        word = TYPE_WORDS.get(alt.get("type"), str(alt.get("type")))
        if "exclusiveMinimum" in alt:
            word += f" above {alt['exclusiveMinimum']}"
        if alt.get("type") == "boolean":
            word = "true, false"
        words += [flow(v) for v in alt.get("enum", [])] or [word]
    return ", ".join(words[:-1]) + f" or {words[-1]}" if len(words) > 1 else words[0]


def explain(e: jsonschema.ValidationError) -> str:
    path = list(e.absolute_path)
    keys = [p for p in path if isinstance(p, str)]
    where = ".".join(keys) + "".join(f"[{p}]" for p in path if isinstance(p, int)) or "the configuration"
    key_path = keys or []
    sub = _sub(schema(), key_path)
    default = sub.get("default") if key_path else None
    if default is None and len(keys) == 3 and keys[0] == "scales":   # a scale's key: that scale's protocol
        default = _sub(schema(), keys[:2]).get("default", {}).get(keys[2])
    example = f"; e.g. {cli(key_path, default)}" if key_path and default not in (None, {}) else ""
    example = example if len(example) < 60 else ""
    v = e.instance
    if e.validator == "type" and "enum" in sub:   # scale=5: say which words it takes
        e.validator, e.validator_value = "enum", sub["enum"]
    if e.validator == "additionalProperties":
        known = sorted(_sub(schema(), path).get("properties", {}))
        extra = sorted(set(v) - set(known))
        name = ".".join(keys + extra[:1])
        return f"{name}: not a configuration key; the keys here are {', '.join(known)}"
    if e.validator == "type" and isinstance(v, str) and v.strip()[:1] in ("[", "{"):
        # 'ks=[1,2' reaches us as the text "[1,2": Snakemake keeps what YAML cannot parse
        shown = f"'{v}'" if not key_path else v
        fix = f"write it whole, e.g. {cli(key_path, default)}" if key_path and default not in (None, {}) \
            else "close its brackets"
        return f"{where}: {shown} is not a {'list' if v.strip()[0] == '[' else 'mapping'} (a bracket is not closed); {fix}"
    if e.validator == "type" and e.validator_value == "array" and not isinstance(v, list):
        items = [v]
        if isinstance(v, str):   # 'ks: 1, 2' in a file reaches us as the text "1, 2"
            try:
                items = yaml.safe_load(f"[{v}]")
            except yaml.YAMLError:
                pass
        if v is None or items == [None]:   # 'ks:' left empty
            items = default if isinstance(default, list) else None
        return f"{where} must be a list: write {cli(key_path, items)}" if items else f"{where} must be a list"
    if e.validator == "type":   # one type, or a list of them (a folder or null)
        wanted = [e.validator_value] if isinstance(e.validator_value, str) else list(e.validator_value)
        return f"{where}: {flow(v)} is not {' or '.join(TYPE_WORDS.get(t, t) for t in wanted)}{example}"
    if e.validator == "minLength" and v == "":   # cache.dir: '' is no folder
        example = cli(key_path, "/scratch/dpscale-cache")
        return f"{where}: '' is empty; write a path, e.g. {example}, or null for the default"
    if e.validator == "enum":
        return f"{where}: {flow(v)} is not one of {', '.join(map(flow, e.validator_value))}{example}"
    if e.validator == "oneOf" and any(c.validator == "uniqueItems" for c in e.context or ()):
        e.validator = "uniqueItems"   # a list in the list branch, but with a repeat: say that, not "not allowed"
    if e.validator == "oneOf":
        return f"{where}: {flow(v)} is not allowed; write {_allowed(e.validator_value)}{example}"
    if e.validator in ("minimum", "exclusiveMinimum", "maximum"):
        word = {"minimum": "below the minimum of", "exclusiveMinimum": "not above",
                "maximum": "above the maximum of"}[e.validator]
        return f"{where}: {flow(v)} is {word} {e.validator_value}{example}"
    if e.validator == "uniqueItems":
        return f"{where}: {flow(v)} repeats an item; write each once, e.g. {cli(key_path, list(dict.fromkeys(v)))}"
    if e.validator == "minItems":
        has = "the list is empty" if not v else f"{flow(v)} has {len(v)} item{'s' * (len(v) != 1)}"
        return f"{where}: {has}; it needs at least {e.validator_value}{example}"
    if e.validator == "pattern":
        return f"{where}: {flow(v)} does not match {e.validator_value}{example}"
    return f"{where}: {e.message}{example}"


def check(config: dict) -> None:
    """Raise ConfigError with one line for the first error (errors deepest in the tree first)."""
    sch = schema()
    errors = sorted(jsonschema.validators.validator_for(sch)(sch).iter_errors(config),
                    key=lambda e: (-len(e.absolute_path), str(list(e.absolute_path))))
    if errors:
        raise ConfigError(explain(errors[0]))


class _KeysOnce(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """YAML keeps the last of two equal keys without a word (PyYAML's choice, and
    Snakemake's configfile loader's): a second `local_dir:` under `data:` would be read
    and the first one silently not. This loader says so instead."""


def _mapping(loader, node, deep=False):
    seen = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise ConfigError(f"{loader.name}: {key} is written twice (lines {seen[key] + 1} and "
                              f"{key_node.start_mark.line + 1}); YAML keeps only the last, so delete one")
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_KeysOnce.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def check_file(path) -> None:
    """Raise ConfigError if the YAML file at `path` writes a key twice in one mapping, or
    is not YAML (Snakemake's own message names neither the line nor the fault)."""
    with open(path) as f:
        loader = _KeysOnce(f)
        loader.name = str(path)
        try:
            loader.get_single_data()
        except yaml.MarkedYAMLError:
            raise ConfigError(_not_yaml(path)) from None
        finally:
            loader.dispose()


def _not_yaml(path) -> str:
    """Where and why `path` is not YAML, in PyYAML's pure-Python words (libyaml's, from
    the C loader, say "did not find expected node content" for an unclosed bracket)."""
    try:
        with open(path) as f:
            yaml.load(f, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        def at(mark):
            return f"line {mark.line + 1}, column {mark.column + 1}"
        why = f"{e.problem} at {at(e.problem_mark)}" if e.problem_mark else str(e.problem or e)
        if e.context and e.context_mark:
            why += f", {e.context} from {at(e.context_mark)}"
        elif e.context:
            why += f", {e.context}"
        return f"{path} is not YAML: {why}; fix it there (indent with spaces, not tabs; close every bracket and quote)"
    return f"{path} is not YAML"
