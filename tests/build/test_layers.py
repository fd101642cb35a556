"""Layer and config normalization: equal files give equal bytes whatever the clock, order or owner names."""

from __future__ import annotations

import io
import tarfile

from kit.build.image_config import config_bytes, epoch_of, normalize_config
from kit.build.layers import canonical_key, first_differences, layer_listing, normalize_layer, sort_layer

EPOCH = 1704067200


def layer(entries, *, mtime, uname="builder", order=None):
    """A layer tar of (name, data|None for a dir) in the given order."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in (order or entries):
            info = tarfile.TarInfo(name)
            info.mtime, info.uname, info.gname = mtime, uname, uname
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size, info.mode = len(data), 0o644
                info.pax_headers = {"atime": str(mtime + 0.5), "ctime": str(mtime + 0.25)}
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def normalized(data: bytes):
    out = io.BytesIO()
    result = normalize_layer(io.BytesIO(data), out, epoch=EPOCH)
    if result.reordered:
        sorted_out = io.BytesIO()
        result = sort_layer(io.BytesIO(out.getvalue()), sorted_out, epoch=EPOCH)
        out = sorted_out
    return result, out.getvalue()


FILES = [("opt/", None), ("opt/rlk/", None), ("opt/rlk/a.py", b"print(1)\n"), ("opt/rlk.txt", b"x"),
         ("var/log/apt/history.log", b"Start-Date: today")]


def test_clock_and_owner_names_do_not_reach_the_bytes():
    first, a = normalized(layer(FILES, mtime=1_800_000_000))
    second, b = normalized(layer(FILES, mtime=1_900_000_123, uname="someone-else"))
    assert a == b and first.diff_id == second.diff_id
    listing = layer_listing(io.BytesIO(a))
    assert {entry["mtime"] for entry in listing.values()} == {EPOCH}


def test_entry_order_is_canonical_whatever_the_engine_walked():
    walked = [FILES[0], FILES[3], FILES[1], FILES[2], FILES[4]]   # rlk.txt before rlk/
    result, data = normalized(layer(FILES, mtime=1, order=walked))
    assert result.diff_id == normalized(layer(FILES, mtime=1))[0].diff_id
    names = list(layer_listing(io.BytesIO(data)))
    assert names == sorted(names, key=canonical_key)


def test_logs_are_dropped_and_named():
    result, data = normalized(layer(FILES, mtime=1))
    assert result.dropped == ["var/log/apt/history.log"]
    assert "var/log/apt/history.log" not in layer_listing(io.BytesIO(data))


def test_a_changed_file_is_named_first_with_both_sides():
    changed = [*FILES[:2], ("opt/rlk/a.py", b"print(2)\n"), *FILES[3:]]
    _, a = normalized(layer(FILES, mtime=1))
    _, b = normalized(layer(changed, mtime=1))
    diffs = first_differences(layer_listing(io.BytesIO(a)), layer_listing(io.BytesIO(b)))
    assert [path for path, _, _ in diffs] == ["opt/rlk/a.py"]
    assert diffs[0][1]["sha256"] != diffs[0][2]["sha256"] and diffs[0][1]["size"] == 9


def test_config_keeps_the_dockerfile_and_drops_the_machine():
    raw = {"architecture": "amd64", "os": "linux", "created": "2026-12-04T05:00:00.123Z", "docker_version": "20.10.24",
           "container": "abc", "container_config": {"Hostname": "abc"},
           "config": {"Hostname": "abc", "Image": "sha256:" + "1" * 64, "Env": ["A=1"], "Labels": {"x": "1"}},
           "history": [{"created": "2026-12-04T05:00:01Z", "created_by": "RUN true"}],
           "rootfs": {"type": "layers", "diff_ids": ["sha256:" + "2" * 64]}}
    other = {**raw, "created": "2027-01-01T00:00:00Z", "container": "def", "docker_version": "27.0",
             "config": {**raw["config"], "Hostname": "def", "Image": "sha256:" + "3" * 64}}
    ids = ["sha256:" + "4" * 64]
    a = normalize_config(raw, ids, epoch=EPOCH, labels={"y": "2"})
    assert config_bytes(a) == config_bytes(normalize_config(other, ids, epoch=EPOCH, labels={"y": "2"}))
    assert a["created"] == "2024-01-01T00:00:00Z" and a["history"][0]["created_by"] == "RUN true"
    assert a["config"]["Labels"] == {"x": "1", "y": "2"} and a["config"]["Env"] == ["A=1"]
    assert epoch_of(a["created"], 0) == EPOCH
