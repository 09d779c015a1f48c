#!/usr/bin/env python3
"""Read a py-spy speedscope profile (tools/lab/profile_launch.sh) as a timeline: per
process and thread, the runs of consecutive samples that sat in the same place, the
place being the deepest frame of this project (dpscale/ or scripts/) and the frame it
called, so a reader sees in order where a launch's seconds went, idle waits included.

    python3 tools/lab/spy_stages.py PROFILE.speedscope.json [--min-s 0.3] [--match rank]
"""
import argparse
import json


def place(stack: list[dict]) -> str:
    """The deepest own frame and its callee (the frame's file stem and function)."""
    own = [i for i, f in enumerate(stack) if "/dpscale/" in f["file"] or "/scripts/" in f["file"]]
    if not own:
        leaf = stack[-1] if stack else {"name": "?", "file": "?"}
        return f"(outside) {stack[0]['name'] if stack else '?'} .. {leaf['name']}"
    i = own[-1]
    here = f"{stack[i]['file'].rsplit('/', 1)[-1]}:{stack[i]['name']}"
    below = stack[i + 1:]
    if not below:
        return here
    nxt, leaf = below[0], below[-1]
    return f"{here} > {nxt['name']}" + (f" .. {leaf['name']}" if leaf is not nxt else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("profile")
    ap.add_argument("--min-s", type=float, default=0.3, help="shortest run shown (s)")
    ap.add_argument("--match", default="", help="only profiles whose name contains this")
    a = ap.parse_args()
    doc = json.load(open(a.profile))
    frames = doc["shared"]["frames"]
    for prof in doc["profiles"]:
        if a.match not in prof["name"]:
            continue
        unit = {"seconds": 1.0, "milliseconds": 1e-3, "microseconds": 1e-6}.get(prof.get("unit"), 1.0)
        total = sum(prof["weights"]) * unit
        if total < a.min_s:
            continue
        print(f"== {prof['name']}: {total:.2f} s sampled")
        runs = []
        for sample, w in zip(prof["samples"], prof["weights"]):
            key = place([frames[i] for i in sample])
            if runs and runs[-1][0] == key:
                runs[-1][1] += w * unit
            else:
                runs.append([key, w * unit])
        t = 0.0
        for key, s in runs:
            if s >= a.min_s:
                print(f"  {t:7.2f} +{s:6.2f} s  {key}")
            t += s


if __name__ == "__main__":
    main()
