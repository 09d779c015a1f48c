"""What a measurement reads of the data stage: the resize cache, checked against
its recorded sha256, and the raw files checked against those recorded when they were
fetched (the book's DataLoader reads them). Nothing here downloads: fetching, the
mirrors and the system package live in dpscale.data.fetch, which no worker imports,
so a change there reruns no measurement.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

# numpy is imported inside the functions that need it.
SPLITS = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", 60_000),
          "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte", 10_000)}


class DataError(RuntimeError):
    """A dataset problem the user can act on; the message says how."""


def raw_dir(root: str | os.PathLike) -> Path:
    return Path(root) / "FashionMNIST" / "raw"


def sha256(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def verify_raw(root) -> dict:
    """Check the unpacked files against the checksums recorded when they were
    fetched; a truncated or altered file is named, with how to rebuild it."""
    root = Path(root)
    prov = json.loads((root / "source.json").read_text())
    for name, rec in prov["files"].items():
        path = (raw_dir(root) / name).with_suffix("")
        if not path.is_file():
            raise DataError(f"{path} is missing; rebuild with `snakemake --forcerun download`")
        if (got := sha256(path)) != rec["unpacked_sha256"]:
            raise DataError(f"{path}: sha256 {got[:12]}... differs from {rec['unpacked_sha256'][:12]}... "
                            f"recorded in {root / 'source.json'}: the file is truncated or altered. "
                            "Rebuild with `snakemake --forcerun download`.")
    return prov


def load_cache(npz, meta_json, verify: bool = True) -> tuple[dict, dict]:
    """Read the resize cache, checking it against the checksum recorded beside it."""
    import numpy as np
    npz, meta_json = Path(npz), Path(meta_json)
    try:
        meta = json.loads(meta_json.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise DataError(f"{meta_json}: unreadable ({e}); rebuild with "
                        f"`snakemake --forcerun resize {npz}`") from e
    if verify and (got := sha256(npz)) != meta["sha256"]:
        raise DataError(f"{npz}: sha256 {got[:12]}... does not match {meta['sha256'][:12]}... recorded "
                        f"in {meta_json}; the cache is corrupted. Rebuild it with "
                        f"`snakemake --forcerun resize {npz}` (or delete it and rerun).")
    with np.load(npz) as z:
        arrays = {key: z[key] for key in z.files}
    return arrays, meta
