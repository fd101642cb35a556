"""A host wheelhouse for images too large to send as a build context: found, checked, served.

The CUDA image installs gigabytes of locked wheels. Sending them as a build context would put
them in the engine's memory and copy them again; instead the kit finds each locked file in the
wheelhouse directories (``--wheelhouse DIR`` / ``$KIT_WHEELHOUSE``, then the workspace, where
missing ones are downloaded with ``pip download --require-hashes``), checks every file's sha256
against the lock (a stat-keyed cache keeps a second build fast), and serves exactly those files
read-only over HTTP on the engine's bridge for the duration of the build
(:mod:`kit.build.wheel_server`). The lock's entries are split into the image's layers by
rebuild cost. Example::

    files = locate_wheels(lock, [Path("/cache/wheelhouse")], workspace=Path(".workspace"))
    files["torch-2.9.1-cp311-cp311-manylinux_2_28_x86_64.whl"]   # Path to the checked file
    [group.name for group in layer_groups(lock)]    # ["1-cuda", "2-torch", "3-packages", "4-te"]
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from kit.model.documents import schema_id
from kit.model.errors import BadInput, CheckFailed
from kit.model.lock import lock_sha256, platform_tags

_CHUNK = 1 << 20
# Layers in the order of their rebuild cost: what changes least (and weighs most) first.
TORCH_LAYER = ("torch", "triton", "torchvision", "torchaudio")
TE_PREFIX = "transformer-engine"
CACHE_SCHEMA = schema_id("hash-cache")


@dataclass(frozen=True)
class LayerGroup:
    name: str             # "1-cuda": the requirements file layers/<name>.txt and its RUN step
    packages: tuple[dict, ...]

    def requirements(self) -> str:
        """``pip install --require-hashes --no-deps -r`` input: one line per distribution, all its hashes."""
        return "".join(f"{p['name']}=={p['version']} "
                       + " ".join(f"--hash=sha256:{f['sha256']}" for f in p["files"]) + "\n"
                       for p in self.packages)


def layer_of(name: str) -> str:
    """``layer_of("nvidia-cudnn-cu12") == "1-cuda"``: which image layer installs a distribution.

    The venv's own tools (pip, setuptools, wheel) go first with the CUDA libraries: they change
    as rarely, and pip installs the rest.
    """
    if name.startswith(("nvidia-", "cuda-", "cupy-")) or name in ("pip", "setuptools", "wheel"):
        return "1-cuda"
    if name in TORCH_LAYER:
        return "2-torch"
    if name.startswith(TE_PREFIX):
        return "4-te"
    return "3-packages"


LAYERS = ("1-cuda", "2-torch", "3-packages", "4-te")


def layer_groups(lock: dict) -> list[LayerGroup]:
    """The lock split into :data:`LAYERS` (a layer with nothing locked stays, empty)."""
    by_layer: dict[str, list[dict]] = {name: [] for name in LAYERS}
    for pkg in sorted(lock["packages"], key=lambda p: p["name"]):
        by_layer[layer_of(pkg["name"])].append(pkg)
    return [LayerGroup(name, tuple(pkgs)) for name, pkgs in by_layer.items()]


# --- the files ------------------------------------------------------------------------------------

class StatCache:
    """sha256 per absolute path, valid while size, mtime_ns and inode are unchanged (hash-cache/v1)."""

    def __init__(self, path: Path):
        self.path = path
        self.entries: dict[str, dict] = {}
        if path.is_file():
            try:
                self.entries = json.loads(path.read_text()).get("entries", {})
            except (OSError, ValueError):
                self.entries = {}   # a damaged cache is re-made, never trusted
        self.dirty = False

    def sha256(self, file: Path, progress=None) -> str:
        st = file.stat()
        key = str(file.resolve())
        entry = self.entries.get(key)
        if entry and entry["size"] == st.st_size and entry["mtime_ns"] == st.st_mtime_ns:
            return entry["sha256"]
        if progress and st.st_size > 50_000_000:
            progress(f"hashing {file.name} ({st.st_size / 1e6:.0f} MB)")
        digest = hashlib.sha256()
        with open(file, "rb") as handle:
            for chunk in iter(lambda: handle.read(_CHUNK), b""):
                digest.update(chunk)
        self.entries[key] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest.hexdigest()}
        self.dirty = True
        return digest.hexdigest()

    def save(self) -> None:
        if not self.dirty:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"schema": CACHE_SCHEMA, "entries": self.entries}, sort_keys=True))
        os.replace(tmp, self.path)


def wheelhouse_dirs(given: list[Path] | tuple[Path, ...] = ()) -> list[Path]:
    """``--wheelhouse`` directories, else ``$KIT_WHEELHOUSE`` (``:``-separated)."""
    if given:
        return [Path(d) for d in given]
    return [Path(d) for d in os.environ.get("KIT_WHEELHOUSE", "").split(":") if d]


def locate_wheels(lock: dict, dirs: list[Path], *, workspace: Path, download: bool = True,
                  progress=None) -> dict[str, Path]:
    """``{file name: path}``: one checked file per locked distribution.

    A file whose bytes do not match the lock fails here, naming it (CheckFailed, exit 1); missing
    files are downloaded into ``workspace/wheelhouse/<lock sha256[:16]>`` by their hashes (a file
    no index has, such as a wheel compiled here, is named with the directories searched).
    """
    own = workspace / "wheelhouse" / lock_sha256(lock)[:16]
    # Earlier locks' downloads too: a file is taken by its name and checked by its hash either way.
    earlier = sorted(p for p in (workspace / "wheelhouse").glob("*") if p.is_dir() and p != own)
    search = [*dirs, own, *earlier]
    cache = StatCache(workspace / "cache" / "wheel-hashes.json")
    found: dict[str, Path] = {}
    missing: list[dict] = []
    try:
        for pkg in lock["packages"]:
            hit = _find(pkg, search)
            if hit is None:
                missing.append(pkg)
                continue
            _check(hit[0], hit[1], pkg, cache, progress)
            found[hit[0].name] = hit[0]
        if missing and download:
            _download(missing, lock, own, progress)
            for pkg in missing:
                hit = _find(pkg, [own])
                if hit is not None:
                    _check(hit[0], hit[1], pkg, cache, progress)
                    found[hit[0].name] = hit[0]
        left = [p for p in missing if not any(f["file"] in found for f in p["files"])]
        if left:
            names = ", ".join(f"{p['name']} {p['version']} ({p['files'][0]['file']})" for p in left[:8])
            raise BadInput(f"{len(left)} locked file(s) are in no wheelhouse ({', '.join(map(str, search))}): "
                           f"{names}; put them in a --wheelhouse DIR (or $KIT_WHEELHOUSE)")
    finally:
        cache.save()
    return found


def _find(pkg: dict, dirs: list[Path]) -> tuple[Path, dict] | None:
    for directory in dirs:
        for entry in pkg["files"]:
            path = directory / entry["file"]
            if path.is_file():
                return path, entry
    return None


def _check(path: Path, entry: dict, pkg: dict, cache: StatCache, progress) -> None:
    found = cache.sha256(path, progress)
    if found != entry["sha256"]:
        raise CheckFailed(f"{path}: sha256 {found} is not the {entry['sha256']} the lock pins for "
                          f"{pkg['name']} {pkg['version']}: one of the two changed; restore the file or the lock "
                          "(a removed file is downloaded again by its hash)")


def _download(missing: list[dict], lock: dict, directory: Path, progress) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    reqs = directory / "missing.txt"
    reqs.write_text(LayerGroup("missing", tuple(missing)).requirements())
    if progress:
        progress(f"downloading {len(missing)} locked distribution(s) into {directory}")
    py = lock["target"]["python"].split(".")
    platforms = [a for tag in platform_tags(lock["target"]["python_platform"]) for a in ("--platform", tag)]
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes",
                           "--only-binary=:all:", "--python-version", f"{py[0]}.{py[1]}", *platforms,
                           "--dest", str(directory), "-r", str(reqs)], capture_output=True, text=True)
    if proc.returncode != 0 and "DO NOT MATCH THE HASHES" in proc.stderr:
        # The index serves other bytes than the lock pins: name each file and both hashes.
        lines = [" ".join(line.split()) for line in proc.stderr.splitlines()
                 if " from " in line or "Expected sha256" in line or line.strip().startswith("Got")]
        raise CheckFailed("the index's files differ from the lock: " + "; ".join(lines[:9]))
    if proc.returncode != 0 and progress:
        # What could be fetched stays; the files no index has are named by the caller.
        progress(f"pip download: {proc.stderr.strip().splitlines()[-1][:200] if proc.stderr.strip() else 'failed'}")


# Installed size of a wheel set against its compressed size (the VIME lock: 5.3 GB of wheels, 11.3 GB
# of layers); the kit-written image needs the layer tars and the engine's load of them beside it.
INSTALLED_RATIO = 2.2
COPIES_NEEDED = 3


def disk_shortfall(plan, workspace: Path) -> str | None:
    """Why the kit cannot write this image's layers itself here (too little disk), or None.

    Writing the layers takes the normalized tars (one image size) and the engine's load of them
    (its extracted archive and the layers: two more) on top of the engine's own build.
    """
    wheels = sum(Path(path).stat().st_size for _, path in plan.served)
    need = int(wheels * INSTALLED_RATIO * COPIES_NEEDED)
    workspace.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(workspace).free
    if free >= need:
        return None
    return (f"not enough disk to write the layers reproducibly (about {need / 1e9:.0f} GB needed beside the build, "
            f"{free / 1e9:.0f} GB free at {workspace}): the engine's image is tagged as built, so its id is not "
            "reproducible elsewhere; free space and build again (--no-cache) for the kit-written image")
