"""Data stage: the real download code against an HTTP server on loopback
(success, a corrupted file, no server), the stand-in, IDX, and the resize cache."""
from __future__ import annotations

import functools
import http.server
import shutil
import socket
import threading
from pathlib import Path

import numpy as np
import pytest

from dpscale.data import fetch as dfetch, load as dload, resize as dresize


@pytest.fixture(scope="module")
def served_files(tmp_path_factory):
    """Synthetic .gz files and their md5s, standing in for the published ones."""
    root = tmp_path_factory.mktemp("src")
    dfetch.write_synthetic(root)
    files = dload.raw_dir(root)
    resources = tuple((name, dfetch.md5(files / name)) for name, _ in dfetch.RESOURCES)
    return files, resources


class _Server:
    def __init__(self, folder: Path):
        handler = functools.partial(_QuietHandler, directory=str(folder))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def _closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/"   # nothing listens there now


def test_download_success(tmp_path, served_files):
    files, resources = served_files
    with _Server(files) as srv:
        used = dfetch.download(tmp_path, [srv.url], retries=1, resources=resources)
    assert used == [srv.url] * 4
    for name, digest in resources:
        assert dfetch.md5(dload.raw_dir(tmp_path) / name) == digest
    assert not list(dload.raw_dir(tmp_path).glob(".dl-*")), "temp folders left behind"


def test_corrupted_file_tries_next_mirror_then_fails_clearly(tmp_path, served_files):
    files, resources = served_files
    bad = tmp_path / "bad"
    shutil.copytree(files, bad)
    victim = bad / "train-labels-idx1-ubyte.gz"
    victim.write_bytes(victim.read_bytes()[:-10] + b"0123456789")
    with _Server(bad) as bad_srv, _Server(files) as good_srv:
        used = dfetch.download(tmp_path / "a", [bad_srv.url, good_srv.url], retries=2, resources=resources)
        assert used[1] == good_srv.url and used[0] == bad_srv.url
        with pytest.raises(dload.DataError) as e:
            dfetch.download(tmp_path / "b", [bad_srv.url], retries=2, backoff_s=0, resources=resources)
    msg = str(e.value)
    assert "train-labels-idx1-ubyte.gz" in msg and "checksum mismatch" in msg
    assert msg.count("attempt") == 1, "a bad checksum must not be retried on the same mirror"
    assert not (dload.raw_dir(tmp_path / "b") / "train-labels-idx1-ubyte.gz").exists()


def test_no_server_falls_back_under_auto_and_fails_under_download(tmp_path, served_files, caplog):
    _, resources = served_files
    url = _closed_port_url()
    prov = dfetch.fetch(tmp_path / "auto", "auto", [url], retries=2, backoff_s=0, resources=resources,
                      system_dirs=())
    assert prov["source"] == "synthetic" and "Connection refused" in prov["fallback_reason"]
    assert "SYNTHETIC STAND-IN" in caplog.text
    x = dfetch.read_idx(dload.raw_dir(tmp_path / "auto") / "train-images-idx3-ubyte")
    assert x.shape == (60_000, 28, 28) and x.dtype == np.uint8
    with pytest.raises(dload.DataError, match="could not download"):
        dfetch.fetch(tmp_path / "dl", "download", [url], retries=1, backoff_s=0, resources=resources)


def test_local_folder_is_checked(tmp_path, served_files):
    files, _ = served_files
    with pytest.raises(dload.DataError, match="md5"):   # synthetic files are not Fashion-MNIST
        dfetch.fetch(tmp_path, "local", [], local_dir=files)
    with pytest.raises(dload.DataError, match="not a folder"):
        dfetch.fetch(tmp_path, "local", [], local_dir=tmp_path / "nope")


def _recompressed(src: Path, dest: Path, alter: str | None = None) -> dict:
    """The four files as another packager ships them: the same bytes, gzipped anew
    (another level, another header), so their .gz md5s differ. Returns the unpacked md5s."""
    import gzip
    import hashlib
    dest.mkdir(parents=True, exist_ok=True)
    unpacked = {}
    for name, _ in dfetch.RESOURCES:
        body = gzip.decompress((src / name).read_bytes())
        unpacked[name] = hashlib.md5(body).hexdigest()
        if name == alter:
            body = body[:-1] + bytes([body[-1] ^ 1])   # one bit of one pixel
        (dest / name).write_bytes(gzip.compress(body, compresslevel=2, mtime=1234))
    return unpacked


def test_a_recompressed_copy_passes_by_its_unpacked_md5_and_an_altered_one_is_refused(tmp_path, served_files):
    files, resources = served_files
    unpacked = _recompressed(files, tmp_path / "repacked")
    prov = dfetch.fetch(tmp_path / "a", "local", [], local_dir=tmp_path / "repacked", resources=resources,
                      unpacked=unpacked)
    assert prov["source"] == "real" and set(prov["checks"].values()) == {"published unpacked md5 (recompressed .gz)"}
    assert all(dfetch.md5(tmp_path / "repacked" / n) != d for n, d in resources)   # the .gz md5s differ
    _recompressed(files, tmp_path / "altered", alter="t10k-images-idx3-ubyte.gz")
    with pytest.raises(dload.DataError, match=r"altered/t10k-images-idx3-ubyte.gz: md5 .* not the published"):
        dfetch.fetch(tmp_path / "b", "local", [], local_dir=tmp_path / "altered", resources=resources,
                   unpacked=unpacked)
    assert not dload.raw_dir(tmp_path / "b").exists() or not any(dload.raw_dir(tmp_path / "b").iterdir())


def test_auto_takes_a_local_copy_before_the_network_and_skips_a_bad_one(tmp_path, served_files):
    files, resources = served_files
    unpacked = _recompressed(files, tmp_path / "bad", alter="train-labels-idx1-ubyte.gz")
    _recompressed(files, tmp_path / "good")
    prov = dfetch.fetch(tmp_path / "r", "auto", [_closed_port_url()], retries=1, backoff_s=0, resources=resources,
                      unpacked=unpacked, local_dir=tmp_path / "bad", system_dirs=(str(tmp_path / "good"),))
    assert prov["source"] == "real" and prov["origin"] == str(tmp_path / "good")
    assert prov["rejected"][0]["folder"] == str(tmp_path / "bad") and "train-labels" in prov["rejected"][0]["reason"]
    assert dfetch.local_candidates(None, ()) == [] and dfetch.local_candidates(tmp_path / "good", ()) == [str(tmp_path / "good")]


@pytest.mark.parametrize("fault", ["misspelt", "a file missing"])
def test_auto_says_a_named_folder_that_cannot_serve(tmp_path, served_files, caplog, fault):
    """data.local_dir names the user's copy: a typo or a missing file is refused in the
    log and the provenance (the run's end says so), never quietly replaced by another copy."""
    files, resources = served_files
    unpacked = _recompressed(files, tmp_path / "good")
    named = tmp_path / "mine"
    if fault == "a file missing":
        _recompressed(files, named)
        (named / "t10k-labels-idx1-ubyte.gz").unlink()
    prov = dfetch.fetch(tmp_path / "r", "auto", [_closed_port_url()], retries=1, backoff_s=0, resources=resources,
                        unpacked=unpacked, local_dir=named, system_dirs=(str(tmp_path / "good"),))
    assert prov["source"] == "real" and prov["origin"] == str(tmp_path / "good")
    assert [r["folder"] for r in prov["rejected"]] == [str(named)]
    why = "not a folder" if fault == "misspelt" else "t10k-labels-idx1-ubyte.gz is missing"
    assert why in prov["rejected"][0]["reason"] and f"{named} refused" in caplog.text


def test_a_home_relative_local_dir_is_the_users_home(tmp_path, served_files, monkeypatch):
    files, resources = served_files
    unpacked = _recompressed(files, tmp_path / "home" / "fm")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    prov = dfetch.fetch(tmp_path / "r", "local", [], local_dir="~/fm", resources=resources, unpacked=unpacked)
    assert prov["source"] == "real" and set(prov["checks"]) == {n for n, _ in resources}
    assert dfetch.local_candidates("~/fm", (), resources) == [str(tmp_path / "home" / "fm")]


DEBIAN = Path("/usr/share/datasets/fashion-mnist")


@pytest.mark.skipif(not DEBIAN.is_dir(), reason="Debian's dataset-fashion-mnist is not installed "
                    "(apt-get install dataset-fashion-mnist; .ci/run installs it)")
def test_debians_package_is_real_fashion_mnist_and_its_altered_copy_is_not(tmp_path):
    """Files no one here wrote: Debian recompressed them, so only the unpacked md5s match."""
    prov = dfetch.fetch(tmp_path / "deb", "auto", [], local_dir=None)
    assert prov["source"] == "real" and prov["origin"] == str(DEBIAN), prov
    assert set(prov["checks"].values()) == {"published unpacked md5 (recompressed .gz)"}
    assert prov["package"]["name"] == "dataset-fashion-mnist" and prov["package"]["version"]
    y = dfetch.read_idx(dload.raw_dir(tmp_path / "deb") / "t10k-labels-idx1-ubyte")
    assert y.shape == (10_000,) and np.bincount(y).tolist() == [1000] * 10
    _recompressed(DEBIAN, tmp_path / "altered", alter="train-images-idx3-ubyte.gz")
    with pytest.raises(dload.DataError, match="train-images-idx3-ubyte.gz: md5"):
        dfetch.fetch(tmp_path / "x", "local", [], local_dir=tmp_path / "altered")


def test_synthetic_is_deterministic_and_learnable():
    x1, y1 = dfetch.synthetic(2000, seed=0)
    x2, y2 = dfetch.synthetic(2000, seed=0)
    assert np.array_equal(x1, x2) and np.array_equal(y1, y2)
    assert set(np.unique(y1)) == set(range(10))
    # class structure: nearest class mean beats chance (10%) by far
    xf = x1.reshape(len(x1), -1).astype(np.float32)
    means = np.stack([xf[:1000][y1[:1000] == c].mean(0) for c in range(10)])
    pred = np.argmin(((xf[1000:, None] - means[None]) ** 2).sum(-1), axis=1)
    assert (pred == y1[1000:]).mean() > 0.5


def test_idx_roundtrip_and_truncation(tmp_path):
    a = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    dfetch.write_idx_gz(tmp_path / "a.gz", a)
    assert np.array_equal(dfetch.read_idx(tmp_path / "a.gz"), a)
    raw = tmp_path / "a"
    import gzip
    raw.write_bytes(gzip.decompress((tmp_path / "a.gz").read_bytes())[:-3])
    with pytest.raises(dload.DataError, match="truncated"):
        dfetch.read_idx(raw)


@pytest.mark.parametrize("size", [16, 32, 64, 100])
def test_resize_equals_torchvision_transform_bit_for_bit(size):
    """The cache is what the seed's DataLoader computes per sample: Resize(size), then
    ToTensor (x / 255, which the reader does), so the uint8s must be equal, not close;
    also for a non-square image (the shorter side to size)."""
    from PIL import Image
    from torchvision import transforms
    x, _ = dfetch.synthetic(50, seed=3)
    tf = transforms.Resize(size)
    for images in (x, np.ascontiguousarray(x[:, :, 2:26])):   # 28x28, and 28 high x 24 wide
        cached = dresize.resize_split(images, size)
        ref = np.stack([np.asarray(tf(Image.fromarray(img, mode="L"))) for img in images])
        assert cached.dtype == np.uint8 and cached.shape == ref.shape and np.array_equal(cached, ref)
        loader = transforms.Compose([tf, transforms.ToTensor()])(Image.fromarray(images[7], mode="L")).numpy()[0]
        assert np.array_equal(cached[7].astype(np.float32) / 255, loader)


def test_cache_checksum_detects_corruption(tmp_path):
    x, y = dfetch.synthetic(32, seed=0)
    arrays = {"train_x": x, "train_y": y, "test_x": x[:4], "test_y": y[:4]}
    meta = dresize.write_cache(arrays, {"source": "synthetic"}, tmp_path / "c.npz", tmp_path / "c.json")
    loaded, meta2 = dload.load_cache(tmp_path / "c.npz", tmp_path / "c.json")
    assert np.array_equal(loaded["train_x"], x) and meta2["sha256"] == meta["sha256"]
    blob = bytearray((tmp_path / "c.npz").read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    (tmp_path / "c.npz").write_bytes(bytes(blob))
    with pytest.raises(dload.DataError, match=r"c\.npz.*sha256.*--forcerun resize"):
        dload.load_cache(tmp_path / "c.npz", tmp_path / "c.json")
