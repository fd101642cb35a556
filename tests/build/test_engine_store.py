"""Layers read from the engine's store (overlay2 + tar-split) are the engine's layer tars: the same
bytes as `docker save` gives, checked against each diff id, and a store that differs from its
records is caught and the save stream used instead."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import subprocess
import uuid
from pathlib import Path

import pytest

import kit.build.reproduce as reproduce
from kit.adapters.docker_storage import StoreMismatch, stored_image
from kit.build.reproduce import _save_normalized, _store_normalized, base_layers, normalize_image

pytestmark = pytest.mark.docker
BASE = "rlk-kit/debian-base:bookworm"
EPOCH = 1704067200

# Every kind of entry a layer can hold: files, a hard link, a symlink, a deleted file (a whiteout),
# a directory replaced as a whole (opaque), an empty file, long and odd names.
DOCKERFILE = f"""FROM {BASE}
RUN mkdir -p /opt/t/keep /opt/t/gone /opt/t/opaque && echo a > /opt/t/keep/a && echo b > /opt/t/gone/b \\
    && echo old > /opt/t/opaque/old && head -c 3000000 /dev/urandom > /opt/t/big && touch /opt/t/empty
RUN rm -rf /opt/t/gone /opt/t/opaque && mkdir /opt/t/opaque && echo new > /opt/t/opaque/new \\
    && ln /opt/t/keep/a /opt/t/keep/hard && ln -s ../keep/a /opt/t/keep/soft \\
    && printf 'x' > "/opt/t/keep/name with spaces and ü" && mkdir -p /opt/t/$(printf 'd%.0s' $(seq 1 120))/deep \\
    && echo marker-{{marker}} > /opt/t/marker
"""


@pytest.fixture(scope="module")
def test_image(docker_engine):
    driver = docker_engine.info().get("Driver")
    # the reader is for overlay2 only (other drivers build through docker save); CI's engine
    # (scripts/ensure-docker.sh, dockerd's default driver) is overlay2, and so must a developer's be here
    assert driver == "overlay2", (f"these tests read an overlay2 store; the Docker engine's storage driver is "
                                  f"{driver} (start dockerd with its default driver, overlay2)")
    text = DOCKERFILE.replace("{marker}", uuid.uuid4().hex)
    image, _ = docker_engine.images.build(fileobj=io.BytesIO(text.encode()), rm=True, nocache=True)
    yield image.id
    docker_engine.images.remove(image.id, force=True)


def test_the_store_gives_each_layer_as_the_engine_tars_it(docker_engine, test_image):
    stored = stored_image(docker_engine, test_image)
    assert stored is not None, "this engine's overlay2 store is readable here (root, local engine)"
    assert hashlib.sha256(stored.config).hexdigest() == test_image.split(":")[1]
    assert list(stored.diff_ids) == docker_engine.images.get(test_image).attrs["RootFS"]["Layers"]
    for index, diff_id in enumerate(stored.diff_ids):
        sha = hashlib.sha256()
        for chunk in stored.layer_chunks(index):
            sha.update(chunk)
        assert "sha256:" + sha.hexdigest() == diff_id, f"layer {index}"


def test_store_and_save_give_the_same_normalized_layers(docker_engine, test_image, tmp_path):
    base = base_layers(docker_engine, BASE)
    stored = stored_image(docker_engine, test_image)
    (tmp_path / "store").mkdir()
    (tmp_path / "save").mkdir()
    _, config_a, from_store = _store_normalized(stored, tmp_path / "store", len(base), EPOCH, lambda text: None)
    manifest, config_b, from_save = _save_normalized(docker_engine, test_image, tmp_path / "save", set(base), EPOCH,
                                                     lambda text: None)
    assert config_a == config_b
    a = [(d, r.diff_id if r else None) for d, r, _ in from_store.values()]
    b = [(from_save[name][0], from_save[name][1].diff_id if from_save[name][1] else None) for name in manifest["Layers"]]
    assert a == b and len(a) == len(base) + 2


def _tampered_copy(stored, tmp_path: Path, edit) -> object:
    """The stored image with its layers' files (the base's aside) copied under tmp_path, the
    last layer's changed by ``edit``."""
    for record in stored.layer_dirs[1:]:
        cache_id = (record / "cache-id").read_text().strip()
        (tmp_path / "overlay2" / cache_id).mkdir(parents=True)
        # cp -a: overlay2 keeps deletions as character devices, which copytree cannot copy
        subprocess.run(["cp", "-a", str(stored.driver_root / cache_id / "diff"), str(tmp_path / "overlay2" / cache_id)],
                       check=True)
    edit(tmp_path / "overlay2" / cache_id / "diff")
    return dataclasses.replace(stored, driver_root=tmp_path / "overlay2")


def test_a_store_that_differs_from_its_records_is_caught(docker_engine, test_image, tmp_path):
    stored = stored_image(docker_engine, test_image)
    base = len(base_layers(docker_engine, BASE))

    def same_size_other_bytes(diff: Path):
        (diff / "opt/t/marker").write_bytes(b"X" * (diff / "opt/t/marker").stat().st_size)

    changed = _tampered_copy(stored, tmp_path / "a", same_size_other_bytes)
    (tmp_path / "out-a").mkdir()
    with pytest.raises(StoreMismatch, match=f"layer {len(stored.diff_ids) - 1}: the engine's store gives"):
        _store_normalized(changed, tmp_path / "out-a", base, EPOCH, lambda text: None)

    missing = _tampered_copy(stored, tmp_path / "b", lambda diff: (diff / "opt/t/marker").unlink())
    (tmp_path / "out-b").mkdir()
    with pytest.raises(StoreMismatch, match="opt/t/marker"):
        _store_normalized(missing, tmp_path / "out-b", base, EPOCH, lambda text: None)


def test_a_bad_store_falls_back_to_the_save_stream_with_the_same_result(docker_engine, test_image, tmp_path,
                                                                        monkeypatch):
    base = base_layers(docker_engine, BASE)
    tag = f"rlk-kit/store-test:{uuid.uuid4().hex[:12]}"
    good = normalize_image(docker_engine, test_image, tag=tag, epoch=EPOCH, base_diff_ids=base, workdir=tmp_path / "w1")
    assert good.read_from == "engine-store"
    stored = stored_image(docker_engine, test_image)
    bad = _tampered_copy(stored, tmp_path / "t", lambda diff: (diff / "opt/t/marker").write_text("changed\n"))
    monkeypatch.setattr(reproduce, "stored_image", lambda client, image_id: bad)
    notes = []
    again = normalize_image(docker_engine, test_image, tag=tag, epoch=EPOCH, base_diff_ids=base,
                            workdir=tmp_path / "w2", progress=notes.append)
    try:
        assert again.read_from == "save" and again.image_id == good.image_id
        assert any("reading the engine's store failed" in note for note in notes), notes
    finally:
        docker_engine.images.remove(tag, force=True)


def test_no_store_is_read_where_the_engine_keeps_it_out_of_reach(docker_engine, test_image, tmp_path):
    class Elsewhere:   # an engine whose root is not on this machine (remote, or another mount namespace)
        def info(self):
            return {**docker_engine.info(), "DockerRootDir": str(tmp_path / "not-here")}

    class OtherDriver:
        def info(self):
            return {**docker_engine.info(), "Driver": "btrfs"}

    assert stored_image(Elsewhere(), test_image) is None
    assert stored_image(OtherDriver(), test_image) is None
    assert stored_image(docker_engine, "sha256:" + "0" * 64) is None
