"""Resolve: the shell around uv that turns a stack's pins into a lock document.

uv (a Python dependency of the kit) resolves the stack's top-level pins for the platform's
target (Python version, wheel platform) into PEP 751 ``pylock.toml``; this module keeps, per
distribution, its version and the file names and sha256 of the wheels for that target (the sdist
only where no wheel exists) and drops every URL: the index is configuration, not identity.
Example::

    lock = resolve_lock(catalog.stack("vime-g11").document, "cuda")
    len(lock["packages"])       # about 200
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import unquote, urlparse

from kit.model.errors import BadInput
from kit.model.lock import LOCK_SCHEMA, excludes_of, normalize, platform_kind, requirements_of, target_of

ROCM_TORCH_INDEX = "https://download.pytorch.org/whl/rocm{version}"
# What uv says when it cannot reach an index (it exits 2 for both a network and a resolution error).
_NETWORK_MARKERS = ("Failed to fetch", "dns error", "error sending request", "Could not connect",
                    "failed to lookup address", "Connection refused", "Network is unreachable", "timed out",
                    "client error (Connect)", "tcp connect error", "network was disabled")


class Unreachable(BadInput):
    """The index cannot be reached: nothing was resolved (exit 2, never a silent pass)."""


def uv_command() -> list[str]:
    """The uv executable shipped by the ``uv`` wheel (the kit's dependency), else one on PATH."""
    try:
        from uv import find_uv_bin

        return [find_uv_bin()]
    except (ImportError, FileNotFoundError):
        return ["uv"]


def uv_version() -> str:
    proc = subprocess.run([*uv_command(), "--version"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BadInput("uv is not installed: `pip install uv` (a dependency of the kit)")
    return proc.stdout.split()[1]


def compile_command(requirements: Path, excludes: Path | None, target: dict, out: Path, *,
                    index: str | None = None, find_links: list[str] = ()) -> list[str]:
    """The plain ``uv pip compile`` that a lock is made from (the benchmark runs the same line)."""
    cmd = [*uv_command(), "pip", "compile", str(requirements), "--python-version", target["python"],
           "--python-platform", target["python_platform"], "--no-header", "--quiet", "--no-config",
           "-o", str(out)]
    if excludes is not None:
        cmd += ["--excludes", str(excludes)]
    if index:
        cmd += ["--index-url", index]
    for link in find_links:
        cmd += ["--find-links", link]
    return cmd


def rocm_problem(stack_doc: dict, platform: str, index: str | None) -> str | None:
    """Why a ROCm platform cannot be resolved here (its torch index unreachable), with what to run where
    it is; None when the index answers."""
    version = target_of(stack_doc, platform)["accelerator"].get("version")
    if not version:
        return f"platform {platform}: the ROCm release is unknown; declare platforms.{platform}.rocm_version"
    url = index or ROCM_TORCH_INDEX.format(version=version)
    try:
        urllib.request.urlopen(f"{url.rstrip('/')}/torch/", timeout=5).close()
        return None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return (f"stack {stack_doc['name']!r} platform {platform}: torch for ROCm {version} comes from the PyTorch "
                f"ROCm index {url}, which is not reachable from here ({reason}). Where it is reachable, run: "
                f"kit lock {stack_doc['name']} --platform {platform} --index {url} --extra-index "
                "https://pypi.org/simple  and commit the lock it writes")


def resolve_lock(stack_doc: dict, platform: str, *, index: str | None = None, extra_index: str | None = None,
                 find_links: list[str] = (), progress=None, requirements: list[str] | None = None) -> dict:
    """The lock document of one platform of a resolved stack; Unreachable (exit 2) without an index.
    ``requirements`` replaces the stack's pins (``kit lock --check`` resolves a lock's own versions)."""
    if platform not in stack_doc.get("platforms", {}):
        raise BadInput(f"--platform {platform}: stack {stack_doc['name']!r} has platforms "
                       f"{', '.join(sorted(stack_doc.get('platforms', {})))}")
    if platform_kind(platform) == "rocm":
        problem = rocm_problem(stack_doc, platform, index)
        if problem:
            raise Unreachable(problem)
    target = target_of(stack_doc, platform)
    requirements = requirements if requirements is not None else requirements_of(stack_doc, platform)
    excludes = excludes_of(stack_doc)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kit-lock-") as tmp:
        req = Path(tmp) / "requirements.in"
        req.write_text("".join(r + "\n" for r in requirements))
        exc_file = None
        if excludes:
            exc_file = Path(tmp) / "excludes.txt"
            exc_file.write_text("".join(e + "\n" for e in excludes))
        out = Path(tmp) / "pylock.toml"
        cmd = compile_command(req, exc_file, target, out, index=index, find_links=find_links)
        if extra_index:
            cmd += ["--extra-index-url", extra_index]
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "UV_NO_PROGRESS": "1"})
        if proc.returncode != 0:
            raise _resolve_error(stack_doc["name"], platform, proc.stderr)
        pylock = tomllib.loads(out.read_text())
    if progress:
        progress(f"{stack_doc['name']} {platform}: resolved in {time.monotonic() - started:.1f} s")
    doc = {"schema": LOCK_SCHEMA, "stack": stack_doc["name"], "platform": platform, "target": target,
           "resolver": {"name": "uv", "version": uv_version()}, "requirements": requirements,
           "packages": packages_from_pylock(pylock)}
    if excludes:
        doc["excludes"] = excludes
    return doc


def _resolve_error(stack: str, platform: str, stderr: str) -> BadInput:
    text = " ".join(stderr.split())
    if any(m in stderr for m in _NETWORK_MARKERS):
        return Unreachable(f"stack {stack!r} platform {platform}: the package index is not reachable, nothing "
                           f"was resolved ({text[-300:]}); give a reachable one with --index URL or --find-links DIR")
    return BadInput(f"stack {stack!r} platform {platform}: uv cannot resolve its pins: {text[-700:]}")


def packages_from_pylock(pylock: dict) -> list[dict]:
    """Lock entries from a PEP 751 document: normalized name, version, wheel files (or the sdist)."""
    out = []
    for pkg in pylock.get("packages", []):
        wheels = pkg.get("wheels") or []
        files = [_file_entry(w) for w in wheels] if wheels else ([_file_entry(pkg["sdist"])] if "sdist" in pkg else [])
        if not files:
            raise BadInput(f"{pkg['name']} {pkg.get('version')}: the resolver found no file for it (a path or VCS "
                           "requirement?); a lock needs a wheel or sdist with a sha256")
        out.append({"name": normalize(pkg["name"]), "version": pkg["version"],
                    "files": sorted(files, key=lambda f: f["file"])})
    return sorted(out, key=lambda p: p["name"])


def _file_entry(entry: dict) -> dict:
    where = entry.get("name") or entry.get("url") or entry.get("path") or ""
    name = unquote(urlparse(where).path.rsplit("/", 1)[-1]) if "/" in where else where
    sha = (entry.get("hashes") or {}).get("sha256")
    if not sha:
        raise BadInput(f"{name}: the resolver gave no sha256 for it; a lock needs one for every file")
    out = {"file": name, "sha256": sha}
    if isinstance(entry.get("size"), int):
        out["size"] = entry["size"]
    return out


def default_find_links() -> list[str]:
    """Local wheel directories pip is configured with here (PIP_FIND_LINKS): configuration, not identity."""
    return [p for p in os.environ.get("PIP_FIND_LINKS", "").split() if p]

