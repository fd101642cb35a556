"""The one door to the Docker engine: the only module that imports docker-py.

One client factory with one timeout policy, the container options every container the kit starts
gets (runs and checkpoint conversions alike), and image look-ups that turn docker-py's exceptions
into the kit's terms. docker-py is imported on first use, so importing this module costs nothing.
Example::

    client = engine()                              # BadInput naming dockerd and DOCKER_HOST when none answers
    image = find_image(client, "rlk-kit/smoke:cpu-0123456789ab")    # None when absent
    client.containers.run(image.id, ["true"], **container_options("cpu"))
"""

from __future__ import annotations

import datetime as _dt
import os
import re

from kit.model.accelerators import docker_py_options
from kit.model.errors import BadInput

# The timeout policy: every engine call may take long (a build streams for minutes, a container wait
# lasts the job), so the client's default is generous; a question whose answer is only nice to have
# (a dry run's base id, doctor's "is there an engine") is asked with QUICK_TIMEOUT_S and given up.
TIMEOUT_S = 600
QUICK_TIMEOUT_S = 5
DOCTOR_TIMEOUT_S = 20
ENGINE_HELP = ("start one with `nohup dockerd >/tmp/dockerd.log 2>&1 &` or scripts/ensure-docker.sh, "
               "or point DOCKER_HOST at a running engine")


class EngineError(Exception):
    """The engine refused a request (a malformed reference, a failed start); ``str()`` is its explanation."""


def client(timeout: float = TIMEOUT_S):
    """A docker-py client from the environment (DOCKER_HOST or the default socket); not yet asked anything."""
    import docker   # heavy: only when an engine is talked to

    return docker.from_env(timeout=timeout)


def engine(timeout: float = TIMEOUT_S):
    """A client whose engine answers a ping; BadInput (exit 2) saying how to start one otherwise."""
    try:
        found = client(timeout)
        found.ping()
        return found
    except Exception as exc:  # DockerException, connection errors: all mean "no engine"
        where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        raise BadInput(f"no Docker engine answers at {where} ({type(exc).__name__}); {ENGINE_HELP}") from None


def engine_facts(timeout: float = DOCTOR_TIMEOUT_S) -> dict:
    """``{"client", "version", "api_version", "runtimes"}``, or ``{"error": one line}`` when no engine answers."""
    try:
        found = client(timeout)
        version = found.version()
        info = found.info()
    except Exception as exc:  # docker-py raises several types for "no engine"
        return {"error": str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}
    return {"client": found, "version": version.get("Version", "?"), "api_version": version.get("ApiVersion", "?"),
            "runtimes": sorted((info.get("Runtimes") or {}).keys())}


def _explained(exc) -> EngineError:
    return EngineError(getattr(exc, "explanation", None) or str(exc))


def find_image(engine_client, ref: str):
    """The image ``ref`` names on the engine, or None; EngineError when the engine refuses the look-up."""
    import docker

    try:
        return engine_client.images.get(ref)
    except docker.errors.ImageNotFound:
        return None
    except docker.errors.APIError as exc:   # e.g. a malformed reference
        raise _explained(exc) from None


def list_images(engine_client, *, labels: dict[str, str] | None = None, name: str | None = None) -> list:
    """Images carrying every label given (or of one repository name); EngineError when listing fails."""
    import docker

    try:
        if labels is not None:
            return engine_client.images.list(filters={"label": [f"{k}={v}" for k, v in labels.items()]})
        return engine_client.images.list(name=name)
    except docker.errors.DockerException as exc:
        raise _explained(exc) from None


def own_bytes(engine_client) -> dict[str, int]:
    """{image id: the bytes only that image holds (its size less the layers it shares)}, from the engine's
    disk-usage report; EngineError when the engine will not give it."""
    import docker

    try:
        rows = engine_client.df().get("Images") or []
    except docker.errors.DockerException as exc:
        raise _explained(exc) from None
    return {row["Id"]: max(0, row.get("Size", 0) - max(0, row.get("SharedSize", 0))) for row in rows if "Id" in row}


def retag(engine_client, image_id: str, ref: str) -> None:
    """Point ``ref`` (repository:tag) at ``image_id``; the image it named before is removed when no
    other tag or container holds it (so one ref keeps one image, not one per build)."""
    import docker

    previous = find_image(engine_client, ref)
    repository, _, tag = ref.rpartition(":")
    try:
        engine_client.images.get(image_id).tag(repository, tag=tag)
        if previous is not None and previous.id != image_id and len(previous.tags) <= 1:
            engine_client.images.remove(previous.id)
    except docker.errors.APIError as exc:   # in use by a container or a child image: kept, not an error
        if previous is None or "conflict" not in str(exc).lower():
            raise _explained(exc) from None


def start_container(container) -> None:
    """Start a created container; EngineError with the engine's reason when it will not start."""
    import docker

    try:
        container.start()
    except docker.errors.APIError as exc:
        raise _explained(exc) from None


def _rfc3339_key(text: str | None) -> tuple[int, int]:
    """(seconds, nanoseconds) of the engine's RFC 3339 time; (0, 0) when absent or unreadable.

    The engine writes the fraction with trailing zeros dropped, so the strings themselves do not
    sort ("…:56.1Z" is later than "…:56.12Z" as text)."""
    m = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)?$", text or "")
    if not m:
        return (0, 0)
    when = _dt.datetime.fromisoformat(m.group(1) + ("+00:00" if m.group(3) in (None, "Z") else m.group(3)))
    return (int(when.timestamp()), int((m.group(2) or "0").ljust(9, "0")[:9]))


def image_age_key(image) -> tuple:
    """Sort key, oldest first: the engine's creation time to the nanosecond, then when the image was
    last tagged, then the id (a total order). Reproducible builds give every image one creation time
    (SOURCE_DATE_EPOCH), so among them the one ``kit build`` made or reused last is the newest
    (:func:`mark_built`), not whichever id is larger."""
    last_tag = _rfc3339_key((image.attrs.get("Metadata") or {}).get("LastTagTime"))
    return (*_rfc3339_key(image.attrs.get("Created")), *last_tag, image.id)


def mark_built(engine_client, image_id: str, ref: str) -> None:
    """Tag ``image_id`` as ``ref`` again: the engine records the time (LastTagTime), which
    :func:`image_age_key` reads, so the image a build made or reused counts as the newest."""
    import docker

    repository, _, tag = ref.rpartition(":")
    try:
        engine_client.images.get(image_id).tag(repository, tag=tag)
    except docker.errors.APIError as exc:
        raise _explained(exc) from None


def newest(images):
    """The newest image by :func:`image_age_key`, or None."""
    return max(images, key=image_age_key, default=None)


def ref_of(image) -> str:
    """How an image is named in manifests and reports: its first tag in sorted order, else its id."""
    return min(image.tags) if image.tags else image.id


def container_options(platform: str) -> dict:
    """The ``containers.run`` options of every container the kit starts, per platform, from the accelerator
    table (kit/model/accelerators.py: GPUs for CUDA through ``device_requests``, ``/dev/kfd`` and ``/dev/dri``
    for ROCm, never privileged). Pure; no engine."""
    from docker.types import DeviceRequest, Ulimit   # heavy: only when options are built

    opts = docker_py_options(platform)
    if "device_requests" in opts:
        opts["device_requests"] = [DeviceRequest(**d) for d in opts["device_requests"]]
    if "ulimits" in opts:
        opts["ulimits"] = [Ulimit(**u) for u in opts["ulimits"]]
    return opts
