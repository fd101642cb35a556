"""Provenance of a run's identity: did it run its stack's pinned lock, or only whatever the host had?

A run is ``pinned`` when an image built from the lock its manifest names ran (the manifest records the
lock as installed: run-manifest/v3 ``lock.installed``, for v2 the image's label) and the identity probed
in it shows every package and source of the stack as locked. Two runs that are not both pinned may
still match each other (``same-host``): that is evidence about those two runs on that host, not about
the stack. Example::

    pinned_reasons(E.read_manifest(Path("ws/runs/r1")))
    # ('no image ran (runtime local): the software is what the host had', 'lock 3f2a... (committed-lock) was
    #  not installed: nothing was installed from it', '10 differences from the pinned stack: python 3.11.7 -> 3.11.2; ...')
"""

from __future__ import annotations

from kit.build.probe import identity_differences

PINNED = "pinned"
SAME_HOST = "same-host"


def lock_installed(lock: dict) -> bool:
    """Whether the packages were installed from the lock a manifest names: run-manifest/v3 says so
    (``installed``); for v2 only the image's label (``image-label``) was what a build installed and checked."""
    if "installed" in lock:
        return lock["installed"] is True
    return lock.get("source") == "image-label"


def pinned_reasons(manifest: dict) -> tuple[str, ...]:
    """Why a run's observed identity is not its stack's lock; () when it is (``pinned``): an image ran,
    built from the lock the manifest names, and the identity probed in it shows every package and source
    of the stack as locked (the recorded differences, and the probe held to the stack document again here)."""
    reasons = []
    image = manifest.get("image")
    runtime = (manifest.get("runtime") or {}).get("kind", "?")
    if not isinstance(image, dict) or not image.get("id"):
        reasons.append(f"no image ran (runtime {runtime}): the software is what the host had")
    lock = manifest.get("lock")
    if not isinstance(lock, dict):
        reasons.append(f"the manifest names no lock ({manifest.get('schema')})")
    elif not lock_installed(lock):
        reasons.append(f"lock {str(lock.get('sha256'))[:12]} ({lock.get('source')}) was not installed: "
                       "nothing was installed from it")
    observed = manifest.get("observed_identity")
    stack_doc = (manifest.get("stack") or {}).get("document")
    if not isinstance(observed, dict) or not isinstance(stack_doc, dict):
        reasons.append("no observed identity to hold to the stack")
        return tuple(reasons)
    try:
        recorded = [tuple(map(str, d)) for d in manifest.get("identity_differences") or [] if len(d) == 3]
        found = list(dict.fromkeys(recorded + [tuple(map(str, d)) for d in identity_differences(observed, stack_doc)]))
    except (TypeError, KeyError, AttributeError) as exc:   # a manifest the schema let through but the probe cannot read
        return (*reasons, f"observed identity not comparable with the stack ({type(exc).__name__}: {exc})")
    if found:
        shown = "; ".join(f"{f} {e} -> {o}" for f, e, o in found[:3]) + (f"; and {len(found) - 3} more" if len(found) > 3 else "")
        reasons.append(f"{len(found)} differences from the pinned stack: {shown}")
    return tuple(reasons)


def run_identity(manifest: dict, run: str | None = None) -> dict:
    reasons = pinned_reasons(manifest)
    return {"run": run or str(manifest.get("run_id")), "stack": str((manifest.get("stack") or {}).get("name")),
            "pinned": not reasons, "reasons": reasons}
