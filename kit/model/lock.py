"""Lock: every distribution one platform of a stack installs, by exact version and file sha256.

A lock is written by ``kit lock`` (kit/build/resolve.py runs the resolver) and judged here by
pure rules: one CUDA major across the whole lock and the platform, no CUDA package in a ROCm
lock and the reverse, torch's local version matching the platform, and the lock matching its
stack's top-level pins. The rules fail closed: a package they cannot place is named. Example::

    problems = lock_rule_problems(lock_doc, stack_doc)   # [(json pointer, "rule: message"), ...]
    lock_sha256(lock_doc)                                 # identity: target + packages
"""

from __future__ import annotations

import re

from kit.model.documents import sha256_of_document

# Extras are part of how a package is installed, not of its pin (the stack names the distribution).
INSTALL_EXTRAS = {"ray": "default", "transformer-engine": "pytorch"}
DEFAULT_PYTHON_PLATFORM = "x86_64-manylinux_2_28"
LOCK_SCHEMA = "rlk-kit/lock/v1"

# Package names that carry a CUDA major in their name: nvidia-cudnn-cu12, transformer-engine-cu13,
# nvidia-cutlass-dsl-libs-cu13, cupy-cuda12x.
_CU_SUFFIX_RE = re.compile(r"^(?:nvidia-|transformer-engine-).*?-cu(\d+)$|^transformer-engine-cu(\d+)$")
_CUPY_RE = re.compile(r"^cupy-cuda(\d+)x$")
# cuda-python and cuda-bindings are versioned by the CUDA release they bind (12.9.4 -> CUDA 12), the
# cuda-toolkit metapackage (torch 2.11's CUDA 13 dependencies) by the release it installs (13.0.2).
_VERSIONED_BY_CUDA = ("cuda-bindings", "cuda-python", "cuda-toolkit")
_LOCAL_CU_RE = re.compile(r"\+cu(\d+)")            # 2.9.1+cu128, flashinfer-jit-cache 0.6.3+cu129
_LOCAL_ROCM_RE = re.compile(r"\+rocm(\d+)\.(\d+)")  # 2.9.1+rocm6.3
_ROCM_NAME_RE = re.compile(r"rocm")                 # pytorch-triton-rocm, vllm-rocm …
_CUDA_TAG_RE = re.compile(r"^nvidia/cuda:(\d+)\.(\d+)")
_ROCM_TAG_RE = re.compile(r":(\d+)\.(\d+)(?:\.\d+)?")


def normalize(name: str) -> str:
    """PEP 503 name: ``normalize("Transformer_Engine") == "transformer-engine"``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def platform_kind(platform: str) -> str:
    """``platform_kind("cuda-debian") == "cuda"``: a platform is a kind with an optional variant."""
    return platform.split("-", 1)[0]


def lock_file_name(stack: str, platform: str) -> str:
    """``lock_file_name("vime-g11", "cuda") == "lock-vime-g11-cuda.json"``."""
    return f"lock-{stack}-{platform}.json"


def lock_identity(doc: dict) -> dict:
    """What an image installs: the target and the packages (not the resolver, the note or the stack name)."""
    return {"target": doc["target"], "packages": doc["packages"]}


def lock_sha256(doc: dict) -> str:
    return sha256_of_document(lock_identity(doc))


# --- what a stack asks for ------------------------------------------------------------------------

def accelerator_of(stack_doc: dict, platform: str) -> dict:
    """``{"kind": "cuda", "version": "12.8"}``: declared by the platform, else read from its base tag.

    >>> accelerator_of({"platforms": {"cuda": {"base_image": "nvidia/cuda:12.8.1-devel@sha256:" + "0" * 64}}}, "cuda")
    {'kind': 'cuda', 'version': '12.8'}
    """
    kind = platform_kind(platform)
    entry = stack_doc.get("platforms", {}).get(platform) or {}
    if kind == "cpu":
        return {"kind": "cpu"}
    declared = entry.get(f"{kind}_version")
    if declared:
        return {"kind": kind, "version": declared}
    base = entry.get("base_image", "").split("@", 1)[0]
    m = _CUDA_TAG_RE.match(base) if kind == "cuda" else _ROCM_TAG_RE.search(base.rsplit("/", 1)[-1])
    return {"kind": kind, "version": f"{m.group(1)}.{m.group(2)}"} if m else {"kind": kind}


def target_of(stack_doc: dict, platform: str) -> dict:
    """The interpreter, wheel platform and accelerator a platform's lock is resolved for."""
    entry = stack_doc.get("platforms", {}).get(platform) or {}
    return {"python": entry.get("python", stack_doc.get("python", "")),
            "python_platform": entry.get("python_platform", DEFAULT_PYTHON_PLATFORM),
            "accelerator": accelerator_of(stack_doc, platform)}


def packages_of(stack_doc: dict, platform: str) -> dict[str, str]:
    """The stack's exact pins for a platform (the platform's own win)."""
    merged = dict(stack_doc.get("packages", {}))
    merged.update((stack_doc.get("platforms", {}).get(platform) or {}).get("packages", {}))
    return merged


def requirement(name: str, version: str) -> str:
    """``requirement("ray", "2.57.0") == "ray[default]==2.57.0"``."""
    extra = INSTALL_EXTRAS.get(name)
    return f"{name}[{extra}]=={version}" if extra else f"{name}=={version}"


def requirements_of(stack_doc: dict, platform: str) -> list[str]:
    return sorted(requirement(n, v) for n, v in packages_of(stack_doc, platform).items())


def excludes_of(stack_doc: dict) -> list[str]:
    """Packages the resolver must leave out (a dependency an sdist's static metadata names wrongly)."""
    return sorted(stack_doc.get("excludes", {}))


# --- rules ----------------------------------------------------------------------------------------

def cuda_major(name: str, version: str) -> tuple[int | None, str]:
    """The CUDA major a distribution is built for, and how that is known; (None, "") when it has none.

    >>> cuda_major("nvidia-cudnn-cu12", "9.10.2.21")
    (12, 'its name ends in -cu12')
    >>> cuda_major("torch", "2.9.1+cu128")
    (12, 'its local version +cu128')
    """
    m = _CU_SUFFIX_RE.match(name)
    if m:
        major = m.group(1) or m.group(2)
        return int(major), f"its name ends in -cu{major}"
    m = _CUPY_RE.match(name)
    if m:
        return int(m.group(1)), f"its name is cupy-cuda{m.group(1)}x"
    if name in _VERSIONED_BY_CUDA:
        return int(version.split(".")[0]), f"it is versioned by the CUDA release ({version})"
    m = _LOCAL_CU_RE.search(version)
    if m:
        return int(m.group(1)[:-1]), f"its local version +cu{m.group(1)}"
    return None, ""


def accelerator_problems(doc: dict) -> list[tuple[str, str]]:
    """The CUDA/ROCm consistency rules over one lock, as (JSON pointer, "rule: message")."""
    accel = doc["target"]["accelerator"]
    kind = accel["kind"]
    out: list[tuple[str, str]] = []
    if kind in ("cuda", "rocm") and "version" not in accel:
        out.append(("/target/accelerator/version", f"{kind}-version: the {kind} release is unknown; declare "
                    f"platforms.{doc['platform']}.{kind}_version in the stack (stack/v2; fail closed: nothing can be checked)"))
        return out
    want_major = int(accel["version"].split(".")[0]) if "version" in accel else None
    for i, pkg in enumerate(doc["packages"]):
        name, version = pkg["name"], pkg["version"]
        where = f"/packages/{i}"
        major, why = cuda_major(name, version)
        rocm = _LOCAL_ROCM_RE.search(version)
        if kind == "cuda":
            if major is not None and major != want_major:
                out.append((where, f"cuda-major: {name} {version} is built for CUDA {major} ({why}); the platform "
                                   f"is CUDA {accel['version']}, every CUDA package must be cu{want_major}"))
            if rocm or _ROCM_NAME_RE.search(name):
                out.append((where, f"no-rocm-in-cuda: {name} {version} is a ROCm build in a CUDA lock"))
            if name == "torch" and "+" in version and not _LOCAL_CU_RE.search(version):
                out.append((where, f"torch-local-version: torch {version} is not a CUDA build (+cuXXX or none)"))
        elif kind == "rocm":
            if major is not None:
                out.append((where, f"no-cuda-in-rocm: {name} {version} is a CUDA {major} package ({why}) in a "
                                   "ROCm lock"))
            if name == "torch":
                want = "+rocm" + accel["version"]
                if not version.endswith(want):
                    out.append((where, f"torch-local-version: torch {version} in a ROCm {accel['version']} lock "
                                       f"must carry {want}"))
        else:
            if major is not None:
                out.append((where, f"no-cuda-in-cpu: {name} {version} is a CUDA {major} package ({why}) in a "
                                   "cpu lock"))
            if rocm:
                out.append((where, f"no-rocm-in-cpu: {name} {version} is a ROCm build in a cpu lock"))
    return out


def lock_rule_problems(doc: dict, stack_doc: dict | None = None) -> list[tuple[str, str]]:
    """Every rule over a schema-valid lock; with its resolved stack, also that it locks that stack."""
    out: list[tuple[str, str]] = []
    seen: dict[str, int] = {}
    for i, pkg in enumerate(doc["packages"]):
        if pkg["name"] in seen:
            out.append((f"/packages/{i}/name", f"unique: {pkg['name']} is locked twice (also /packages/{seen[pkg['name']]})"))
        seen.setdefault(pkg["name"], i)
        if pkg["name"] != normalize(pkg["name"]):
            out.append((f"/packages/{i}/name", f"name: {pkg['name']!r} is not normalized ({normalize(pkg['name'])!r})"))
    if platform_kind(doc["platform"]) != doc["target"]["accelerator"]["kind"]:
        out.append(("/target/accelerator/kind", f"is {doc['target']['accelerator']['kind']!r}, platform "
                                                f"{doc['platform']!r} is {platform_kind(doc['platform'])!r}"))
    out += accelerator_problems(doc)
    versions = {p["name"]: p["version"] for p in doc["packages"]}
    for i, req in enumerate(doc["requirements"]):
        name, version = re.sub(r"\[.*\]", "", req).split("==", 1)
        if versions.get(normalize(name)) != version:
            found = versions.get(normalize(name), "nothing")
            out.append((f"/requirements/{i}", f"pins: {req} is required but the lock holds {found}"))
    if stack_doc is not None:
        out += _stack_match_problems(doc, stack_doc)
    return out


def _stack_match_problems(doc: dict, stack_doc: dict) -> list[tuple[str, str]]:
    platform = doc["platform"]
    if platform not in stack_doc.get("platforms", {}):
        return [("/platform", f"stack {stack_doc.get('name')!r} has no platform {platform!r}")]
    out = []
    want = requirements_of(stack_doc, platform)
    if sorted(doc["requirements"]) != want:
        added = sorted(set(want) - set(doc["requirements"]))
        gone = sorted(set(doc["requirements"]) - set(want))
        out.append(("/requirements", f"stale: the stack pins {', '.join(added) or 'nothing new'} and no longer "
                                     f"{', '.join(gone) or 'nothing'}; run `kit lock {stack_doc.get('name')} "
                                     f"--platform {platform}`"))
    if sorted(doc.get("excludes", [])) != excludes_of(stack_doc):
        out.append(("/excludes", f"stale: the stack excludes {excludes_of(stack_doc)}, the lock was resolved "
                                 f"without {sorted(doc.get('excludes', []))}"))
    target = target_of(stack_doc, platform)
    for key in ("python", "python_platform", "accelerator"):
        if doc["target"][key] != target[key]:
            out.append((f"/target/{key}", f"is {doc['target'][key]!r}, the stack's platform {platform} gives "
                                          f"{target[key]!r}"))
    excluded = set(excludes_of(stack_doc))
    for i, pkg in enumerate(doc["packages"]):
        if pkg["name"] in excluded:
            out.append((f"/packages/{i}", f"excluded: {pkg['name']} is excluded by the stack: "
                                          f"{stack_doc['excludes'][pkg['name']]}"))
    return out


# --- using a lock ---------------------------------------------------------------------------------

def platform_tags(python_platform: str) -> list[str]:
    """Every wheel platform tag a ``<arch>-manylinux_2_<N>`` target installs (newest first).

    >>> platform_tags("x86_64-manylinux_2_17")[:2], platform_tags("x86_64-manylinux_2_17")[-3:]
    (['manylinux_2_17_x86_64', 'manylinux2014_x86_64'], ['manylinux_2_5_x86_64', 'manylinux1_x86_64', 'linux_x86_64'])
    """
    arch, _, glibc = python_platform.partition("-manylinux_2_")
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    out = []
    for minor in range(int(glibc), 4, -1):
        out.append(f"manylinux_2_{minor}_{arch}")
        if minor in legacy:
            out.append(f"{legacy[minor]}_{arch}")
    return out + [f"linux_{arch}"]


def lock_differences(old: dict, new: dict) -> dict[str, list]:
    """Drift between two locks: added and removed names, changed versions or file hashes.

    >>> lock_differences({"packages": [{"name": "a", "version": "1", "files": []}]}, {"packages": []})
    {'added': [], 'removed': ['a 1'], 'changed': []}
    """
    before = {p["name"]: p for p in old["packages"]}
    after = {p["name"]: p for p in new["packages"]}
    changed = []
    for name in sorted(set(before) & set(after)):
        a, b = before[name], after[name]
        if a["version"] != b["version"]:
            changed.append(f"{name} {a['version']} -> {b['version']}")
        elif {(f["file"], f["sha256"]) for f in a["files"]} != {(f["file"], f["sha256"]) for f in b["files"]}:
            changed.append(f"{name} {a['version']}: files or sha256 differ")
    return {"added": [f"{n} {after[n]['version']}" for n in sorted(set(after) - set(before))],
            "removed": [f"{n} {before[n]['version']}" for n in sorted(set(before) - set(after))],
            "changed": changed}


# A wheel of a plain ``linux_*`` platform tag is built on a host (the kit's TE extension wheel, a site's own
# build): no index serves it, so it is held to the lock and to the wheel a site gives, never to an index.
_LOCAL_WHEEL_RE = re.compile(r"-linux_[a-z0-9_]+\.whl$")


def built_locally(pkg: dict) -> bool:
    """``built_locally({"files": [{"file": "transformer_engine_torch-2.11.0-cp311-cp311-linux_x86_64.whl"}]})`` is True."""
    return any(_LOCAL_WHEEL_RE.search(f["file"]) for f in pkg["files"])


def pinned_requirements(doc: dict) -> list[str]:
    """Every package of a lock pinned to its locked version, those built locally left out (an index has none)."""
    return sorted(f"{p['name']}=={p['version']}" for p in doc["packages"] if not built_locally(p))


def served_problems(committed: dict, served: dict) -> list[str]:
    """What of a lock no index serves as locked any more, from ``served`` (the same packages resolved at
    their locked versions now): a version gone, a locked file gone, a file whose sha256 changed. Any of
    these means the lock no longer installs; a newer release elsewhere does not."""
    now = {p["name"]: p for p in served["packages"]}
    out = []
    for pkg in committed["packages"]:
        if built_locally(pkg):
            continue
        got = now.get(pkg["name"])
        if got is None or got["version"] != pkg["version"]:
            out.append(f"{pkg['name']} {pkg['version']}: no longer served"
                       + (f" (the locked versions now resolve to {got['version']})" if got else ""))
            continue
        files = {f["file"]: f["sha256"] for f in got["files"]}
        for f in pkg["files"]:
            if f["file"] not in files:
                out.append(f"{pkg['name']} {pkg['version']}: {f['file']} is no longer served")
            elif files[f["file"]] != f["sha256"]:
                out.append(f"{pkg['name']} {pkg['version']}: {f['file']} sha256 changed: locked {f['sha256']}, "
                           f"served {files[f['file']]}")
    return out


def local_wheel_problems(committed: dict, found: dict[str, str]) -> tuple[list[str], list[str]]:
    """(problems, notes) for the locally built wheels of a lock, given ``found``: file name -> sha256 of
    the wheels a site supplied (--find-links). A supplied wheel must hash as locked; one not supplied is
    a note, since no index can check it."""
    problems, notes = [], []
    for pkg in committed["packages"]:
        for f in pkg["files"]:
            if not _LOCAL_WHEEL_RE.search(f["file"]):
                continue
            if f["file"] not in found:
                notes.append(f"{pkg['name']} {pkg['version']}: {f['file']} is built locally (no index serves it); "
                             "give the directory holding it with --find-links to check it against the lock")
            elif found[f["file"]] != f["sha256"]:
                problems.append(f"{pkg['name']} {pkg['version']}: {f['file']} sha256 {found[f['file']]} is not the "
                                f"locked {f['sha256']}")
    return problems, notes


def index_drift(committed: dict, fresh: dict) -> dict[str, list]:
    """:func:`lock_differences` less what only differs because a package is built locally (its wheel
    against the index's sdist): what a resolver would now pick instead of the lock."""
    local = {p["name"] for p in committed["packages"] if built_locally(p)}
    drift = lock_differences(committed, fresh)
    drift["changed"] = [c for c in drift["changed"] if c.split(" ", 1)[0] not in local]
    return drift


def hashed_requirements(doc: dict, names: set[str] | None = None) -> str:
    """The lock (or only ``names`` of it) as a requirements file for ``pip install --require-hashes --no-deps -r``."""
    lines = []
    for pkg in doc["packages"]:
        if names is not None and pkg["name"] not in names:
            continue
        hashes = " ".join(f"--hash=sha256:{f['sha256']}" for f in pkg["files"])
        lines.append(f"{pkg['name']}=={pkg['version']} {hashes}\n")
    return "".join(lines)


# The installer of the CUDA/ROCm images, put in place by the base OS's pip from the lock's own hashes.
BOOTSTRAP_PACKAGES = ("uv",)


def install_files(doc: dict) -> dict[str, str]:
    """The requirements files an image installs a lock from (``kit build`` puts them in ``lock/``).

    ``bootstrap.lock``: the installer (uv) alone; ``requirements.lock``: every distribution that has a
    wheel (installed with no resolver and no build); ``requirements-sdist.lock``: the few that exist only
    as an sdist (transformer-engine-torch), built afterwards against the torch already installed.

    >>> files = install_files({"packages": [{"name": "uv", "version": "0.9.7", "files": [{"file": "uv.whl", "sha256": "a"}]},
    ...                                     {"name": "te-torch", "version": "2", "files": [{"file": "te.tar.gz", "sha256": "b"}]}]})
    >>> files["bootstrap.lock"].split(), files["requirements-sdist.lock"].split()
    (['uv==0.9.7', '--hash=sha256:a'], ['te-torch==2', '--hash=sha256:b'])
    """
    wheels = {p["name"] for p in doc["packages"] if any(f["file"].endswith(".whl") for f in p["files"])}
    sdists = {p["name"] for p in doc["packages"]} - wheels
    return {"bootstrap.lock": hashed_requirements(doc, set(BOOTSTRAP_PACKAGES)),
            "requirements.lock": hashed_requirements(doc, wheels),
            "requirements-sdist.lock": hashed_requirements(doc, sdists)}
