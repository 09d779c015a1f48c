"""The data stage's second half: the resize cache, the seed's transform applied once
(torchvision's Resize on PIL images), kept as uint8 with its sha256 beside it.
"""
from __future__ import annotations

import io
from pathlib import Path

from dpscale.data.fetch import read_idx
from dpscale.data.load import SPLITS, raw_dir, sha256, verify_raw
from dpscale.results import portable, utc_now, write_atomic, write_json_atomic


def resize_split(images: np.ndarray, size: int) -> np.ndarray:
    """The seed's transform, applied once: torchvision's Resize(size) on PIL images,
    kept as uint8. ToTensor's /255 is done by the reader, so cached batches equal the
    seed DataLoader's bit for bit (tests/test_data.py holds the two equal).

    Written as the PIL call that Resize makes for a PIL image (the shorter side to
    `size`, the longer truncated in proportion; Image.resize, bilinear, which PIL
    antialiases), not through transforms.Resize: importing torchvision and its per-call
    checks were a large part of the data stage (docs/measurements/readme-run_h200_2026-12-03.md)."""
    import numpy as np
    from PIL import Image
    h, w = images.shape[1:]
    if min(h, w) == size:
        return images.copy()
    new_h, new_w = (size, int(size * w / h)) if h <= w else (int(size * h / w), size)
    out = np.empty((len(images), new_h, new_w), np.uint8)
    for i, img in enumerate(images):
        out[i] = np.asarray(Image.fromarray(img, mode="L").resize((new_w, new_h), Image.Resampling.BILINEAR))
    return out


def build_cache(root, size: int, out_npz, out_json) -> dict:
    import numpy as np
    root = Path(root)
    prov = verify_raw(root)
    arrays = {}
    for split, (img_name, lbl_name, _) in SPLITS.items():
        x = read_idx(raw_dir(root) / img_name)
        arrays[f"{split}_x"] = resize_split(x, size)
        arrays[f"{split}_y"] = read_idx(raw_dir(root) / lbl_name).astype(np.int64)
    return write_cache(arrays, prov, out_npz, out_json)


def write_cache(arrays: dict, prov: dict, out_npz, out_json) -> dict:
    """The .npz atomically, then its sha256 and provenance beside it."""
    import numpy as np
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    write_atomic(out_npz, buf.getvalue())
    meta = {"sha256": sha256(out_npz), "image_size": int(arrays["train_x"].shape[-1]),
            "bytes": Path(out_npz).stat().st_size,
            "n_train": len(arrays["train_y"]), "n_test": len(arrays["test_y"]),
            "source": prov["source"], "origin": prov.get("origin"), "created_utc": utc_now()}
    meta = portable(meta)   # an origin recorded before source.json named it relative
    write_json_atomic(out_json, meta)
    return meta
