"""Checks of images already on the engine: labels, the embedded stack, a probe in a container.

Example::

    check_image("rlk-kit/smoke:cpu-…", catalog.stack("smoke")).matches     # labels + embedded stack
    verify_image_by_probe("rlk-kit/smoke:cpu-…", stack).differences        # probe in a throwaway container
"""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass

from kit.adapters import docker as dockerdoor
from kit.adapters.docker import engine
from kit.build.context import _manifests_dir, stack_lock
from kit.build.installed import freeze_entries, installed_differences
from kit.build.layout import ENTRYPOINT, LABEL_PREFIX, PROBE_AT_BUILD_PATH, PROBE_COMMAND, PROBE_STACK_ENV, STACK_PATH
from kit.build.plan import pin_labels
from kit.build.probe import extension_differences, identity_differences
from kit.model.documents import parse_json_bytes, require_valid
from kit.model.errors import BadInput, CheckFailed
from kit.model.stack import stack_parts


def _image_on_engine(client, ref: str):
    """The image ``ref`` names; BadInput saying how to make it when the engine does not hold it."""
    try:
        image = dockerdoor.find_image(client, ref)
    except dockerdoor.EngineError as exc:
        raise BadInput(f"image {ref!r}: the engine cannot look it up ({exc})") from None
    if image is None:
        raise BadInput(f"image {ref!r} is not on this engine; build it with `kit build`")
    return image


def build_time_probe(client, image_id: str) -> dict:
    """The probe document the image wrote as its last build step, or ``{"error": why}``."""
    data = read_image_file(client, image_id, PROBE_AT_BUILD_PATH)
    if data is None:
        return {"error": f"the image has no {PROBE_AT_BUILD_PATH} (not built by this kit's Dockerfiles)"}
    try:
        probe = json.loads(data)
    except ValueError as exc:
        return {"error": f"{PROBE_AT_BUILD_PATH} is not JSON: {exc}"[:300]}
    if not isinstance(probe, dict) or "error" in probe:
        return {"error": f"{PROBE_AT_BUILD_PATH} is not a probe document"}
    return probe


def image_conformance_fingerprint(client, image_id: str):
    """The kernel-conformance fingerprint the in-image probe recorded at build time.

    A 64-hex string, or ``{"error": why}`` when the image holds none: a missing fingerprint is
    stated, never left out.
    """
    probe = build_time_probe(client, image_id)
    if "error" in probe:
        return probe
    if "conformance_fingerprint" not in probe:
        return {"error": f"{PROBE_AT_BUILD_PATH} carries no conformance_fingerprint (probe run with --no-conformance)"}
    return probe["conformance_fingerprint"]


# --- checks of existing images ---------------------------------------------------------------

@dataclass(frozen=True)
class ImageCheck:
    """Whether an image carries a stack: ``differences`` are (label or field, expected, found)."""

    matches: bool
    differences: list[tuple[str, str | None, str | None]]
    image_id: str = ""


def check_image(image_ref_or_id: str, stack, *, client=None) -> ImageCheck:
    """Compare an image's labels and embedded stack document with ``stack`` (no container is run)."""
    stack_doc, stack_sha, _ = stack_parts(stack)
    client = client or engine()
    image = _image_on_engine(client, image_ref_or_id)
    found = image.labels or {}
    platform = found.get("dev.rlk-kit.platform")
    differences: list[tuple[str, str | None, str | None]] = []
    if platform not in stack_doc.get("platforms", {}):
        differences.append(("dev.rlk-kit.platform", "|".join(sorted(stack_doc.get("platforms", {}))), platform))
    else:
        for key, value in sorted(pin_labels(stack_doc, stack_sha, platform).items()):
            if found.get(key) != value:
                differences.append((key, value, found.get(key)))
        expected_keys = set(pin_labels(stack_doc, stack_sha, platform))
        for key in sorted(found):
            if (key.startswith("dev.rlk-kit.package.") or key.startswith("dev.rlk-kit.source.")) and key not in expected_keys:
                differences.append((key, None, found[key]))
    embedded = read_embedded_stack(client, image.id)
    if embedded is None:
        differences.append((STACK_PATH, stack_sha, None))
    else:
        _, embedded_sha, _ = stack_parts(embedded)
        if embedded_sha != stack_sha:
            differences.append((f"{STACK_PATH} sha256", stack_sha, embedded_sha))
    return ImageCheck(not differences, differences, image.id)


def read_embedded_stack(client, image_id: str) -> dict | None:
    """The stack document baked at /opt/rlk/stack.json, read from a created (never started) container."""
    data = read_image_file(client, image_id, STACK_PATH)
    if data is None:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return None


def read_image_file(client, image_id: str, path: str) -> bytes | None:
    """The bytes of one regular file of an image (None when absent), from a created, never started container."""
    container = client.containers.create(image_id, command=["true"])
    try:
        try:
            chunks, _ = container.get_archive(path)
        except Exception:
            return None
        with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
            member = tar.getmembers()[0]
            handle = tar.extractfile(member) if member.isfile() else None
            return handle.read() if handle is not None else None
    finally:
        container.remove(force=True)


def image_stack_name(image_ref: str, *, client=None) -> str:
    """The stack an image says it holds (its ``dev.rlk-kit.stack.name`` label); BadInput when it says none."""
    client = client or engine()
    image = _image_on_engine(client, image_ref)
    name = (image.labels or {}).get(f"{LABEL_PREFIX}.stack.name")
    if not name:
        raise BadInput(f"image {image_ref!r} has no {LABEL_PREFIX}.stack.name label (not built by `kit build`); "
                       "name the stack it must hold with --arm A or --stack S")
    return name


@dataclass(frozen=True)
class ProbeCheck:
    """Result of running the probe inside an image and comparing it with a stack."""

    matches: bool
    differences: list[tuple[str, str | None, str | None]]
    observed: dict


def verify_image_by_probe(image_ref: str, stack, *, client=None, timeout_s: int = 300) -> ProbeCheck:
    """Run ``kit probe --json`` in a throwaway container of ``image_ref`` and compare it with ``stack``.

    ``verify_image_by_probe("rlk-kit/smoke:cpu-…", catalog.stack("smoke")).differences`` lists
    e.g. ``("sources.rl-kernel.tree", "<expected>", "<observed>")`` after a baked file was edited.
    """
    stack_doc, _, _ = stack_parts(stack)
    client = client or engine()
    _image_on_engine(client, image_ref)
    # The kit's entrypoint, whatever the image's default became (a committed container may have
    # changed it): it puts the stack's venv first on PATH, which is what the probe must observe.
    container = client.containers.create(image_ref, command=PROBE_COMMAND, entrypoint=[ENTRYPOINT],
                                         network_mode="none", environment={PROBE_STACK_ENV: json.dumps(stack_doc)})
    try:
        try:
            dockerdoor.start_container(container)
        except dockerdoor.EngineError as exc:
            reason = str(exc)
            raise BadInput(f"image {image_ref!r} cannot run the kit probe (is it an image `kit build` made? "
                           f"it needs {ENTRYPOINT}): {reason}") from None
        status = container.wait(timeout=timeout_s)
        out = container.logs(stdout=True, stderr=False)
        if status.get("StatusCode") not in (0, 1):
            err = container.logs(stdout=False, stderr=True).decode(errors="replace").strip()[-500:]
            raise CheckFailed(f"probe in {image_ref} exited {status.get('StatusCode')}: {err}")
    finally:
        container.remove(force=True)
    observed = require_valid(parse_json_bytes(out, f"probe output of {image_ref}"), f"probe output of {image_ref}", "probe")
    differences = probe_differences(client, image_ref, observed, stack_doc)
    return ProbeCheck(not differences, differences, observed)


def image_platform(client, image: str) -> str:
    """The platform an image was built for, from its dev.rlk-kit.platform label ("" when unlabelled)."""
    try:
        return (client.images.get(image).labels or {}).get(f"{LABEL_PREFIX}.platform", "")
    except Exception:   # an engine error here leaves the lock comparison to the build-time check
        return ""


def probe_differences(client, image: str, observed: dict, stack_doc: dict) -> list[tuple[str, str | None, str | None]]:
    """What a probe inside a container of ``image`` shows against the stack's pins, and its compiled
    extensions against the image's build-time probe (the only record of those build outputs)."""
    differences = identity_differences(observed, stack_doc)
    at_build = build_time_probe(client, image)
    lock = stack_lock(stack_doc["name"], image_platform(client, image), _manifests_dir())
    if lock is not None:
        # What the build-time check let pass beside the lock (a baked source's distribution) may stay.
        apart = set(freeze_entries(at_build.get("freeze", []))) if not at_build.get("differences") else set()
        differences += installed_differences(lock, freeze_entries(observed.get("freeze", [])), apart)
    if "error" in at_build:
        differences.append(("probe_at_build", PROBE_AT_BUILD_PATH, at_build["error"]))
    else:
        differences += extension_differences(observed, at_build)
    return differences
