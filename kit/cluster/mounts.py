"""What a cluster's nodes mount: the run's inputs read-only where the arm's run reads them
(kit/build/layout.py, as ``kit run``'s docker runtime mounts them) and the shared workspace read-write
at /workspace, so what a job writes outlives its containers. Example::

    node_mounts({"model": Path("/shared/qwen3-8b")}, Path("/shared/ws"))
    # [('/shared/qwen3-8b', '/inputs/model', 'ro'), ('/shared/ws', '/workspace', 'rw')]
"""

from __future__ import annotations

from pathlib import Path

from kit.build import layout as L
from kit.model.errors import BadInput

# the run's input -> (its kit run flag, where the image reads it); kit/run/inputs.py mounts the same paths
INPUT_TARGETS = {"model": ("--model", L.MODEL_DIR), "checkpoint": ("--checkpoint", L.CHECKPOINT_DIR),
                 "prompt_data": ("--prompt-data", f"{L.DATA_DIR}/dapo-math-17k.jsonl")}


def node_mounts(inputs: dict[str, Path | None], workspace: Path) -> list[tuple[str, str, str]]:
    """(host path, container path, ro|rw) for every given input and the workspace; a host path with a
    comma or colon is refused (every runtime's mount list splits on them)."""
    out = [(str(Path(path)), INPUT_TARGETS[name][1], "ro") for name, path in sorted(inputs.items())
           if path is not None]
    out.append((str(workspace), L.WORKSPACE, "rw"))
    for host, _, _ in out:
        if any(c in host for c in ",:") or any(c.isspace() for c in host):
            raise BadInput(f"{host}: a mounted path may not hold ',', ':' or white space (the mount lists split on them)")
    return out
