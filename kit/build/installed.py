"""Installed against lock: the distributions of an environment compared with the lock it was made from.

Run at the end of an image build (``kit probe --check-lock /opt/rlk/lock.json``) and, from the
live container's probe, at ``kit run``. One extra, missing or different distribution, or an
installed file whose bytes no longer match its RECORD hash, is a difference naming it. The kit
itself is installed apart from the lock (its identity is the kit.source-sha256 label). Example::

    installed_differences(lock, freeze_entries(["torch==2.9.1", ...]))   # [(field, expected, observed)]
    record_differences()                                                  # files changed after install
"""

from __future__ import annotations

import base64
import hashlib
import json
from importlib import metadata
from pathlib import Path

from kit.build.layout import SOURCES_DIR
from kit.model.lock import normalize

# Installed with --no-deps from the kit's own wheel, not from the lock.
KIT_DISTRIBUTIONS = ("rlk-kit",)


def freeze_entries(lines: list[str]) -> dict[str, str]:
    """``{"torch": "2.9.1"}`` from ``name==version`` lines (the probe's ``freeze``)."""
    out = {}
    for line in lines:
        name, sep, version = line.partition("==")
        if sep:
            out[normalize(name)] = version
    return out


def installed_versions() -> dict[str, str]:
    """Normalized name -> version of every distribution this interpreter sees."""
    out: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            out.setdefault(normalize(name), dist.version)
    return out


def source_distributions() -> set[str]:
    """Distributions installed from a stack source baked at /opt/rlk/src (RL-Kernel's extensions): pinned by
    commit and tree in the stack, not by the lock. Known by the ``direct_url.json`` pip writes for them."""
    out = set()
    for dist in metadata.distributions():
        try:
            url = json.loads(dist.read_text("direct_url.json") or "{}").get("url", "")
        except ValueError:
            continue
        if url == f"file://{SOURCES_DIR}" or url.startswith(f"file://{SOURCES_DIR}/"):
            out.add(normalize(dist.metadata["Name"] or "?"))
    return out


def installed_differences(lock: dict, installed: dict[str, str],
                          apart: set[str] | frozenset[str] = frozenset()) -> list[tuple[str, str | None, str | None]]:
    """(``lock.<name>``, locked version or None, installed version or None) for each mismatch.

    ``apart``: names installed apart from the lock (``source_distributions()``); the kit's own always are.
    """
    locked = {p["name"]: p["version"] for p in lock["packages"]}
    out = []
    for name in sorted(set(locked) | set(installed)):
        if name in KIT_DISTRIBUTIONS or (name in apart and name not in locked):
            continue
        if locked.get(name) != installed.get(name):
            out.append((f"lock.{name}", locked.get(name), installed.get(name)))
    return out


def record_differences() -> list[tuple[str, str | None, str | None]]:
    """Installed files whose sha256 differs from their distribution's RECORD (edited after install)."""
    out = []
    for dist in metadata.distributions():
        name = normalize(dist.metadata["Name"] or "?")
        for entry in dist.files or []:
            if not entry.hash or entry.hash.mode != "sha256":
                continue
            if entry.suffix == ".pyc":
                # Derived from the .py beside it (checked): a wheel that ships bytecode (numpy 2.2's
                # numpy/distutils) has it recompiled by pip at install, so its RECORD hash is stale.
                continue
            path = Path(entry.locate())
            try:
                digest = hashlib.sha256(path.read_bytes()).digest()
            except OSError:
                out.append((f"record.{name}", str(entry), "missing"))
                continue
            found = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
            if found != entry.hash.value:
                out.append((f"record.{name}", f"{entry} sha256={entry.hash.value}", f"sha256={found}"))
    return out
