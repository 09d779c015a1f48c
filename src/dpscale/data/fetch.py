"""The data stage's first half: the four Fashion-MNIST files from a local copy,
Debian's package, the dataset's mirrors, or (said loudly, recorded) a synthetic
stand-in of the same shape, each checked against its published checksum.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import logging
import os
import socket
import struct
import tempfile
import time
from pathlib import Path

from dpscale.data.load import SPLITS, DataError, raw_dir, sha256
from dpscale.results import portable, utc_now, write_atomic, write_json_atomic

log = logging.getLogger("dpscale.data")
CLASSES = 10
# numpy is imported inside the functions that need it: the workflow imports this module
# when it is parsed (the download rule's params), and parsing stays light.

# (file, md5) as published by the dataset (github.com/zalandoresearch/fashion-mnist)
# and carried by torchvision.datasets.FashionMNIST.resources.
RESOURCES = (
    ("train-images-idx3-ubyte.gz", "8d4fb7e6c68d591d4c3dfef9ec88bf0d"),
    ("train-labels-idx1-ubyte.gz", "25c81989df183df01b3e8a0aad5dffbe"),
    ("t10k-images-idx3-ubyte.gz", "bef4ecab320f06d8554ea6380940ec79"),
    ("t10k-labels-idx1-ubyte.gz", "bb300cfdad3c16e7a12a480ee83cd310"),
)
# md5 of each file's unpacked bytes, as published beside the .gz ones. A packager that
# recompresses the files (Debian's dataset-fashion-mnist does) changes the .gz md5 and
# keeps these: a file is accepted when either matches.
UNPACKED_MD5 = {
    "train-images-idx3-ubyte.gz": "f4a8712d7a061bf5bd6d2ca38dc4d50a",
    "train-labels-idx1-ubyte.gz": "9018921c3c673c538a1fc5bad174d6f9",
    "t10k-images-idx3-ubyte.gz": "8181f5470baa50b63fa0f6fddb340f0a",
    "t10k-labels-idx1-ubyte.gz": "15d484375f8d13e6eb1aabb0c3f46965",
}
# Folders where a system package puts the four files (Debian/Ubuntu: apt-get install
# dataset-fashion-mnist). data.source auto looks here, and in data.local_dir, first.
SYSTEM_DIRS = ("/usr/share/datasets/fashion-mnist",)


def md5(path: str | os.PathLike) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def download(root, mirrors: list[str], retries: int = 3, timeout_s: float = 30.0,
             backoff_s: float = 1.0, resources=RESOURCES) -> list[str]:
    """Fetch the four files from the first mirror that serves each intact.

    Each file goes to a temp folder beside its destination, is checked against the
    published md5 there (torchvision's download_url), and only then renamed into
    place: a killed or corrupted download never leaves a file that looks done.
    Returns the mirror used for each file. Raises DataError naming every failure.
    """
    from torchvision.datasets.utils import download_url

    dest = raw_dir(root)
    dest.mkdir(parents=True, exist_ok=True)
    used, old_timeout = [], socket.getdefaulttimeout()
    socket.setdefaulttimeout(timeout_s)   # download_url has no timeout of its own
    try:
        for name, digest in resources:
            errors, got = [], None
            for mirror in mirrors:
                got = _fetch_one(mirror.rstrip("/") + "/" + name, dest, name, digest,
                                 retries, backoff_s, errors, download_url)
                if got:
                    used.append(mirror)
                    break
            if not got:
                raise DataError(f"could not download {name} intact from any mirror:\n  "
                                + "\n  ".join(errors)
                                + "\nSet data.mirrors to a reachable mirror, data.source: local with "
                                  "data.local_dir, or data.source: synthetic.")
    finally:
        socket.setdefaulttimeout(old_timeout)
    return used


def _fetch_one(url, dest: Path, name, digest, retries, backoff_s, errors, download_url) -> bool:
    """One mirror: up to `retries` attempts; True once the file is in place, intact."""
    for attempt in range(1, retries + 1):
        with tempfile.TemporaryDirectory(dir=dest, prefix=".dl-") as tmp:
            try:
                download_url(url, tmp, name, md5=digest)
            except RuntimeError:  # torchvision: "File not found or corrupted."
                errors.append(f"{url} (attempt {attempt}): checksum mismatch (md5 != published {digest})")
                log.warning(errors[-1])
                return False   # the mirror serves a bad file: retrying won't help
            except OSError as e:  # URLError, timeouts, refused connections
                errors.append(f"{url} (attempt {attempt}): {type(e).__name__}: {e}")
                log.warning(errors[-1])
                time.sleep(backoff_s * attempt)
                continue
            os.replace(Path(tmp) / name, dest / name)
            return True
    return False


def check_file(path: Path, published_md5: str, unpacked_md5: str | None) -> str:
    """Which published checksum a .gz file matches: its own md5, or (recompressed by a
    packager) the md5 of its unpacked bytes. Neither: DataError naming the file."""
    if (got := md5(path)) == published_md5:
        return "published .gz md5"
    try:
        h = hashlib.md5()
        with gzip.open(path, "rb") as f:
            while block := f.read(1 << 22):
                h.update(block)
        inner = h.hexdigest()
    except (OSError, EOFError) as e:
        inner = f"unreadable ({e})"
    if unpacked_md5 and inner == unpacked_md5:
        return "published unpacked md5 (recompressed .gz)"
    raise DataError(f"{path}: md5 {got} is not the published {published_md5}, and its unpacked "
                    f"content's md5 {inner} is not the published {unpacked_md5}: the file is "
                    "corrupted, altered or not Fashion-MNIST. Reinstall or re-download it, or point "
                    "data.local_dir elsewhere.")


def copy_local(root, local_dir, resources=RESOURCES, unpacked=UNPACKED_MD5) -> dict:
    """Take the four .gz files from a folder, each checked against a published md5
    (check_file). Returns {file: which check passed}."""
    local_dir, dest = Path(local_dir), raw_dir(root)
    if not local_dir.is_dir():
        raise DataError(f"data.local_dir: {local_dir} is not a folder; it must hold "
                        + ", ".join(n for n, _ in resources))
    checks = {}
    for name, digest in resources:
        src = local_dir / name
        if not src.is_file():
            raise DataError(f"data.local_dir: {src} is missing")
        checks[name] = check_file(src, digest, unpacked.get(name))
    dest.mkdir(parents=True, exist_ok=True)
    for name, _ in resources:   # only once all four passed: never a mix
        with open(local_dir / name, "rb") as f:
            write_atomic(dest / name, f.read())
    return checks


def configured_dir(local_dir) -> Path:
    """data.local_dir as the user means it: `~` is their home (YAML and --config pass it
    unexpanded, and no shell sits between)."""
    return Path(os.path.expanduser(str(local_dir)))


def local_candidates(local_dir=None, system_dirs=SYSTEM_DIRS, resources=RESOURCES) -> list[str]:
    """Folders holding all four files, in the order source auto tries them: the
    configured data.local_dir, then a system package's folder. Cheap (no reads): the
    download rule's params, so installing the package reruns the data stage."""
    dirs = [str(configured_dir(local_dir))] if local_dir else []
    dirs += [d for d in system_dirs if d not in dirs]
    return [d for d in dirs if all((Path(d) / n).is_file() for n, _ in resources)]


def system_package(folder) -> dict | None:
    """The Debian package (name, version) that installed the files in `folder`, if any."""
    import subprocess
    try:
        owner = subprocess.run(["dpkg-query", "-S", str(Path(folder) / RESOURCES[0][0])],
                               capture_output=True, text=True, timeout=10)
        if owner.returncode:
            return None
        name = owner.stdout.split(":", 1)[0].strip()
        ver = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", name],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return {"manager": "dpkg", "name": name, "version": ver.stdout.strip() or None}


def _from_folders(root, folders: list[str], resources, unpacked) -> dict | None:
    """source auto: the first folder whose four files pass; a rejected folder is said
    loudly and recorded, then the next is tried."""
    rejected = []
    for folder in folders:
        try:
            checks = copy_local(root, folder, resources, unpacked)
        except DataError as e:
            log.error("Fashion-MNIST in %s refused: %s", folder, e)
            rejected.append({"folder": folder, "reason": str(e)})
            continue
        return {"source": "real", "origin": folder, "checks": checks, "package": system_package(folder),
                **({"rejected": rejected} if rejected else {})}
    return {"rejected": rejected} if rejected else None


def write_idx_gz(path, array: np.ndarray) -> None:
    """IDX (the MNIST format): magic 0x0000_08_<ndim>, big-endian dims, uint8 data.
    gzip with mtime=0 so the same array always gives the same bytes (checksums), at
    level 1: what it writes is the synthetic stand-in, whose noise gzip's level 9 took
    4x longer to shrink by a few percent."""
    import numpy as np
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=1) as gz:
        gz.write(header + array.tobytes())
    write_atomic(path, buf.getvalue())


def read_idx(path) -> np.ndarray:
    import numpy as np
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4:
        raise DataError(f"{path}: truncated ({len(data)} bytes); delete it and rerun `snakemake download`")
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise DataError(f"{path}: not an unsigned-byte IDX file (magic {data[:4].hex()})")
    shape = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    body = np.frombuffer(data, np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(shape)):
        raise DataError(f"{path}: holds {body.size} bytes of data, its header says {shape}; "
                        "the file is truncated: delete it and rerun `snakemake download`")
    return body.reshape(shape)


def unpack(root) -> None:
    """torchvision's FashionMNIST looks for the unpacked files: write them beside the .gz."""
    for name, _ in RESOURCES:
        gz = raw_dir(root) / name
        with gzip.open(gz, "rb") as f:
            write_atomic(gz.with_suffix(""), f.read())


def synthetic(n: int, seed: int, size: int = 28) -> tuple[np.ndarray, np.ndarray]:
    """A deterministic labelled stand-in with class structure a network can learn:
    each class is a smooth random template; samples are shifted, contrast-jittered,
    noisy copies of their class's template. Same shapes and dtype as the real set."""
    import numpy as np
    rng = np.random.default_rng(seed)
    tmpl_rng = np.random.default_rng(12345)  # templates identical for train and test
    yy, xx = np.mgrid[0:size, 0:size] / size
    templates = []
    for _ in range(CLASSES):
        img = np.zeros((size, size))
        for _ in range(4):  # a few Gaussian blobs and a stripe per class
            cy, cx = tmpl_rng.uniform(0.2, 0.8, 2)
            s = tmpl_rng.uniform(0.06, 0.2)
            img += tmpl_rng.uniform(0.5, 1.0) * np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * s * s))
        f, phase = tmpl_rng.uniform(2, 6), tmpl_rng.uniform(0, 2 * np.pi)
        img += 0.3 * (np.sin(2 * np.pi * f * (yy if tmpl_rng.random() < .5 else xx) + phase) > 0)
        templates.append(img / img.max())
    labels = rng.integers(0, CLASSES, n).astype(np.uint8)
    shifts = rng.integers(-2, 3, (n, 2))
    gain = rng.uniform(0.7, 1.0, n).astype(np.float32)[:, None, None]
    # each sample its class's template rolled by its shift (np.roll per sample, as one
    # gather), in float32: the full 70,000 took 7.5 s in float64 with a loop of rolls
    rows = (np.arange(size)[None, :] - shifts[:, :1]) % size
    cols = (np.arange(size)[None, :] - shifts[:, 1:]) % size
    imgs = np.stack(templates).astype(np.float32)[labels[:, None, None], rows[:, :, None], cols[:, None, :]]
    imgs = imgs * gain + np.float32(0.08) * rng.standard_normal(imgs.shape, dtype=np.float32)
    return (np.clip(imgs, 0, 1) * 255).round().astype(np.uint8), labels


def write_synthetic(root) -> None:
    dest = raw_dir(root)
    for split, seed in (("train", 0), ("test", 1)):
        img_name, lbl_name, n = SPLITS[split]
        x, y = synthetic(n, seed)
        write_idx_gz(dest / f"{img_name}.gz", x)
        write_idx_gz(dest / f"{lbl_name}.gz", y)


def fetch(root, source: str, mirrors: list[str], local_dir=None, retries: int = 3,
          timeout_s: float = 30.0, backoff_s: float = 1.0, resources=RESOURCES,
          unpacked=UNPACKED_MD5, system_dirs=SYSTEM_DIRS) -> dict:
    """Materialise the raw dataset under `root` and return its provenance.

    source: download (never falls back), local (data.local_dir), synthetic, or auto:
    data.local_dir and a system package's folder (SYSTEM_DIRS) first, then the mirrors,
    and on failure the synthetic stand-in, said loudly here and in every result."""
    root = Path(root)
    local_dir = configured_dir(local_dir) if local_dir else None
    prov = {"requested": source, "created_utc": utc_now()}
    if source == "local":
        checks = copy_local(root, local_dir, resources, unpacked)
        prov.update(source="real", origin=str(local_dir), checks=checks, package=system_package(local_dir))
    elif source == "synthetic":
        write_synthetic(root)
        prov.update(source="synthetic", origin="dpscale.data.fetch.synthetic (seeds 0, 1)")
    elif source in ("download", "auto"):
        found = None
        if source == "auto":
            folders = local_candidates(local_dir, system_dirs, resources)
            if local_dir and str(local_dir) not in folders:
                # the user named a folder that cannot serve (a typo, a missing file): copy_local
                # says why, loudly and in the provenance, instead of quietly using another copy
                folders.insert(0, str(local_dir))
            found = _from_folders(root, folders, resources, unpacked)
        prov.update(found or {})
        if not found or "source" not in found:
            prov.update(_download_or_standin(root, source, mirrors, retries, timeout_s, backoff_s, resources))
    else:
        raise DataError(f"data.source: {source!r} is not one of auto, download, local, synthetic")
    unpack(root)
    prov["files"] = {name: {"md5": md5(raw_dir(root) / name), "published_md5": digest,
                            "unpacked_sha256": sha256((raw_dir(root) / name).with_suffix(""))}
                     for name, digest in resources}
    prov = portable(prov)   # a folder of the run's (data.local_dir: .fmnist) named relative to it
    write_json_atomic(root / "source.json", prov)
    return prov


def _download_or_standin(root, source, mirrors, retries, timeout_s, backoff_s, resources) -> dict:
    try:
        used = download(root, mirrors, retries=retries, timeout_s=timeout_s,
                        backoff_s=backoff_s, resources=resources)
        return {"source": "real", "origin": sorted(set(used)),
                "checks": {name: "published .gz md5" for name, _ in resources}}
    except DataError as e:
        if source == "download":
            raise
        banner = "!" * 78
        log.error("%s\nNO MIRROR SERVED FASHION-MNIST: using the SYNTHETIC STAND-IN.\n"
                  "Every number built from it says data.source=synthetic. Reason:\n%s\n%s",
                  banner, e, banner)
        write_synthetic(root)
        return {"source": "synthetic", "origin": "fallback: no local copy, no mirror answered",
                "fallback_reason": str(e)}
