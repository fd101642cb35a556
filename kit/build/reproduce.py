"""Reproducible images: the engine builds, the kit writes the bytes.

The user's interface stays the engine (a Dockerfile, the classic builder's cache and steps). After
the engine builds, the kit reads the image back — from the engine's own store when this process
can read it (:mod:`kit.adapters.docker_storage`: no copy of the whole image first, the base's
layers not read; each layer checked against its diff id), else from ``docker save`` — rewrites
every layer the build added with :func:`kit.build.layers.normalize_layer` and the config with
:func:`kit.build.image_config.normalize_config`, and loads the result (``docker load``) under the
tag. The base's layers are kept as they are: the base is pinned by its id/digest. A ``docker
load`` of these bytes gives the same image id on any engine that keeps the config's bytes
(Docker 20.10 to 27's classic store, Podman). Example::

    image = normalize_image(client, built_id, tag="rlk-kit/smoke:cpu-…", epoch=1704067200,
                            base_diff_ids=base_layers, workdir=Path(".workspace/tmp/x"))
    image.image_id, [layer["diff_id"] for layer in image.layers]

The stable entry points (other platforms build through them; their signatures do not change):
``kit.build.images.build_image(plan, …)`` (reproducible by default), which calls
``kit.build.repro_build.write_reproducible`` (this module's :func:`normalize_image` plus the
provenance), and ``check_reproducible`` for ``--check-reproducible``.

A multi-GB layer set (the CUDA image) goes through unchanged; what to know:

* Memory stays flat: the engine's layers are read once, in 1 MiB chunks, each rewritten as it
  passes. Disk: ``<workspace>/tmp/layers-<tag>/`` holds every layer the build added
  (uncompressed, the base's layers excluded) until the load; ``keep``/``--check-reproducible``
  keep the first build's tars until the comparison, so plan for twice the added bytes there.
* Time grows with the added bytes (about 1 min per GB on 2 busy cores: save, rewrite, hash, load),
  not with the number of files. A layer tarred out of canonical order is sorted in a second pass.
* The base's layers are not rewritten: they are matched by diff id against ``base_diff_ids``. A
  base that is not itself reproducible (a toolchain image built with the classic builder) pins
  the result to that base's id: load the same base everywhere, or make it the way
  ``docker/make-base-image.sh`` makes the CPU base.
* The kit fixes mtimes, owners, order and the config; file contents are the build's. Every RUN
  that writes Python bytecode needs ``SOURCE_DATE_EPOCH`` and ``PYTHONHASHSEED=0`` (as
  ``docker/Dockerfile.cpu`` sets them), the baked probe ``SOURCE_DATE_EPOCH=… kit probe``
  (no clock, no host name), sources through ``docker/bin/install-source`` (no reflog, a stat-free
  git index); compiled code needs its own care (no ``__DATE__``, ``-ffile-prefix-map``, ``ar D``).
  ``kit build … --check-reproducible`` names the first file that still differs.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from kit.adapters.docker_storage import StoreMismatch, stored_image
from kit.build.image_config import config_bytes, normalize_config
from kit.build.layers import first_differences, layer_listing, normalize_layer, sort_layer
from kit.build.streams import CHUNK, ForwardReader
from kit.model.errors import CheckFailed


@dataclass
class NormalizedImage:
    image_id: str
    config_digest: str            # sha256 of the config before the labels added by ``labels_for``
    layers: list[dict]            # {"diff_id", "size", "from_base"} in image order
    directory: Path               # normalized layer tars, <index>.tar (removed unless kept)
    seconds: dict = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)
    read_from: str = "save"       # "engine-store" when the layers came from the engine's store (docker_storage)


def base_layers(client, base_ref: str) -> list[str]:
    """The diff ids of a base image's layers (kept unchanged in every image built on it)."""
    return list(client.images.get(base_ref).attrs.get("RootFS", {}).get("Layers", []))


def _save_normalized(client, image_id: str, directory: Path, base: set[str], epoch: int, say):
    """Stream ``docker save`` and normalize each layer as it passes: (manifest entry, raw config,
    {archive path: (engine diff id, LayerResult or None for a base layer, normalized file)})."""
    stream = ForwardReader(client.api.get_image(image_id, chunk_size=CHUNK))
    layers: dict[str, tuple] = {}
    manifest = raw_config = None
    with tarfile.open(fileobj=stream, mode="r:") as tar:
        for member in tar:
            if not member.isreg():
                continue
            handle = tar.extractfile(member)
            if member.name == "manifest.json":
                manifest = json.loads(handle.read())[0]
            elif member.name.endswith("/layer.tar"):
                say(f"normalizing layer {len(layers) + 1} ({member.size / 1e6:.0f} MB)")
                out = directory / (member.name.split("/")[0] + ".tar")
                stream.hash_window(member.offset_data, member.size)
                with open(out, "wb") as dst:
                    result = normalize_layer(handle, dst, epoch=epoch)
                for _ in iter(lambda: handle.read(CHUNK), b""):   # the end-of-archive padding: hashed too
                    pass
                engine_digest = stream.digest()
                if engine_digest in base:
                    out.unlink()   # the base's layers stay as the base has them
                    layers[member.name] = (engine_digest, None, None)
                    continue
                if result.reordered:
                    sorted_out = out.with_suffix(".sorted.tar")
                    with open(out, "rb") as src, open(sorted_out, "wb") as dst:
                        result = sort_layer(src, dst, epoch=epoch)
                    sorted_out.replace(out)
                layers[member.name] = (engine_digest, result, out)
            elif member.name.endswith(".json") and "/" not in member.name:
                raw_config = json.loads(handle.read())
    if manifest is None or raw_config is None:
        raise CheckFailed(f"the engine's save of {image_id} has no manifest.json or config")
    return manifest, raw_config, layers


def _store_normalized(stored, directory: Path, base_count: int, epoch: int, say):
    """The layers read from the engine's store (kit.adapters.docker_storage) instead of its save
    stream; the same result as :func:`_save_normalized`. The base's layers are not read at all.
    Each layer's bytes must hash to the diff id the config names, else StoreMismatch."""
    names = [f"{index}/layer.tar" for index in range(len(stored.diff_ids))]
    layers: dict[str, tuple] = {}
    for index, (name, diff_id) in enumerate(zip(names, stored.diff_ids)):
        if index < base_count:
            layers[name] = (diff_id, None, None)
            continue
        stream = ForwardReader(stored.layer_chunks(index))
        stream.hash_window(0)
        out = directory / f"{index}.tar"
        say(f"normalizing layer {index + 1} of {len(names)}")
        with open(out, "wb") as dst:
            result = normalize_layer(stream, dst, epoch=epoch)
        for _ in iter(lambda: stream.read(CHUNK), b""):   # the end-of-archive padding: hashed too
            pass
        engine_digest = stream.digest()
        if engine_digest != diff_id:
            raise StoreMismatch(f"layer {index}: the engine's store gives {engine_digest}, its config says {diff_id}")
        if result.reordered:
            sorted_out = out.with_suffix(".sorted.tar")
            with open(out, "rb") as src, open(sorted_out, "wb") as dst:
                result = sort_layer(src, dst, epoch=epoch)
            sorted_out.replace(out)
        layers[name] = (diff_id, result, out)
    return {"Layers": names}, json.loads(stored.config), layers


def normalize_image(client, built_id: str, *, tag: str, epoch: int, base_diff_ids: list[str], workdir: Path,
                    labels_for=None, keep: bool = False, progress=None) -> NormalizedImage:
    """Rewrite the image ``built_id`` deterministically and load it as ``tag``; see the module docstring.

    ``labels_for(config_digest, layers) -> dict`` adds labels computed from the result (the
    provenance's sha256); ``keep`` leaves the normalized layer tars in ``workdir`` for comparison.
    """
    say = progress or (lambda text: None)
    t0 = time.monotonic()
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    stored = stored_image(client, built_id)
    manifest = None
    if stored is not None and list(stored.diff_ids[:len(base_diff_ids)]) == list(base_diff_ids):
        try:
            manifest, raw_config, saved = _store_normalized(stored, workdir, len(base_diff_ids), epoch, say)
            read_from = "engine-store"
        except (OSError, StoreMismatch, ValueError) as error:   # the save stream gives the engine's own answer
            say(f"reading the engine's store failed ({error}); using docker save")
            shutil.rmtree(workdir)
            workdir.mkdir(parents=True)
    if manifest is None:
        manifest, raw_config, saved = _save_normalized(client, built_id, workdir, set(base_diff_ids), epoch, say)
        read_from = "save"
    t_norm = time.monotonic()
    layers, diff_ids, dropped = [], [], []
    for index, name in enumerate(manifest["Layers"]):
        engine_digest, result, out = saved[name]
        if result is None:
            if index >= len(base_diff_ids) or base_diff_ids[index] != engine_digest:
                raise CheckFailed(f"layer {index} of {built_id} equals a base layer out of place; "
                                  "the image is not built on its base")
            layers.append({"diff_id": engine_digest, "size": None, "from_base": True})
        else:
            layers.append({"diff_id": result.diff_id, "size": result.size, "from_base": False, "file": str(out)})
            dropped += result.dropped
        diff_ids.append(layers[-1]["diff_id"])
    config = normalize_config(raw_config, diff_ids, epoch=epoch)
    config_digest = "sha256:" + hashlib.sha256(config_bytes(config)).hexdigest()
    if labels_for is not None:
        config = normalize_config(raw_config, diff_ids, epoch=epoch, labels=labels_for(config_digest, layers))
    data = config_bytes(config)
    image_id = "sha256:" + hashlib.sha256(data).hexdigest()
    say(f"loading {tag} ({image_id[:19]})")
    _load(client, data, layers, tag)
    loaded = client.images.get(tag).id
    if loaded != image_id:
        raise CheckFailed(f"the engine loaded {tag} as {loaded}, the kit wrote config {image_id}: "
                          "this engine rewrites image configs, so its ids are not portable")
    if not keep:
        for layer in layers:
            layer.pop("file", None)
        shutil.rmtree(workdir)
    seconds = {"read_normalize": round(t_norm - t0, 3), "load": round(time.monotonic() - t_norm, 3)}
    return NormalizedImage(image_id, config_digest, layers, workdir, seconds, sorted(set(dropped)), read_from)


def _load(client, config: bytes, layers: list[dict], tag: str) -> None:
    """``docker load`` of a save-format archive streamed from the layer files (base layers omitted:
    the engine already holds that chain, and a load skips every layer whose chain it holds)."""
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    members: list[tuple[str, bytes | Path]] = [(config_name, config)]
    names = []
    for layer in layers:
        name = layer["diff_id"].split(":", 1)[1] + "/layer.tar"
        names.append(name)
        if not layer["from_base"] and not any(m[0] == name for m in members):
            members.append((name, Path(layer["file"])))
    manifest = json.dumps([{"Config": config_name, "RepoTags": [tag], "Layers": names}]).encode()
    members.append(("manifest.json", manifest))

    def archive():
        for name, body in members:
            info = tarfile.TarInfo(name)
            info.size = len(body) if isinstance(body, bytes) else body.stat().st_size
            yield info.tobuf(format=tarfile.USTAR_FORMAT)
            if isinstance(body, bytes):
                yield body
            else:
                with open(body, "rb") as handle:
                    for chunk in iter(lambda: handle.read(CHUNK), b""):
                        yield chunk
            if info.size % 512:
                yield b"\0" * (512 - info.size % 512)
        yield b"\0" * 1024

    for _ in client.api.load_image(archive(), quiet=True):
        pass


def layer_differences(first: NormalizedImage, second: NormalizedImage, limit: int = 10) -> dict | None:
    """None when both images have equal layers; else the first differing layer and its first files."""
    for index, (a, b) in enumerate(zip(first.layers, second.layers)):
        if a["diff_id"] == b["diff_id"]:
            continue
        listings = []
        for layer in (a, b):
            with open(layer["file"], "rb") as handle:
                listings.append(layer_listing(handle))
        files = [{"path": path, "first": x, "second": y} for path, x, y in first_differences(*listings, limit=limit)]
        return {"layer": index, "first": a["diff_id"], "second": b["diff_id"], "files": files}
    if len(first.layers) != len(second.layers):
        return {"layer": min(len(first.layers), len(second.layers)), "first": None, "second": None, "files": [],
                "note": f"{len(first.layers)} layers against {len(second.layers)}"}
    return None
