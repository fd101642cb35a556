"""An image's config written by the kit: no build-machine clock, host or intermediate ids in it.

The engine's classic builder stamps the config with wall-clock times (``created``, every history
entry), the build container's id (``container``, ``config.Hostname``), the parent image id
(``config.Image``) and its own version. :func:`normalize_config` keeps what the Dockerfile said
(env, entrypoint, labels, history commands) and replaces the rest with values from the inputs.
The image id is the sha256 of :func:`config_bytes`, so equal inputs give equal ids. Example::

    config = normalize_config(raw, ["sha256:…", …], epoch=1704067200, labels={"dev.rlk-kit.x": "1"})
    image_id = "sha256:" + hashlib.sha256(config_bytes(config)).hexdigest()
"""

from __future__ import annotations

import copy
import json
from datetime import datetime, timezone

# Top-level fields that only say which machine, container or engine built the image.
_DROPPED_TOP = ("container", "container_config", "docker_version", "author")


def epoch_timestamp(epoch: int) -> str:
    """``epoch_timestamp(1704067200) == "2024-01-01T00:00:00Z"``."""
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def epoch_of(timestamp: str | None, default: int) -> int:
    """Seconds of an ``…Z`` timestamp (a label's value); ``default`` when there is none."""
    if not timestamp:
        return default
    return int(datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp())


def normalize_config(raw: dict, diff_ids: list[str], *, epoch: int, labels: dict[str, str] | None = None) -> dict:
    """A copy of the engine's config with the build's clock, hosts and intermediate ids removed."""
    config = copy.deepcopy(raw)
    for key in _DROPPED_TOP:
        config.pop(key, None)
    created = epoch_timestamp(epoch)
    config["created"] = created
    for entry in config.get("history", []):
        entry["created"] = created
        entry.pop("author", None)
    inner = config.setdefault("config", {})
    inner["Hostname"] = ""
    inner["Image"] = ""
    if labels:
        inner["Labels"] = {**(inner.get("Labels") or {}), **labels}
    config["rootfs"] = {"type": "layers", "diff_ids": list(diff_ids)}
    return config


def config_bytes(config: dict) -> bytes:
    """The canonical bytes of a config: sorted keys, no spaces (the image id hashes these)."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
