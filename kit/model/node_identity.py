"""A cluster node's declared identity: which image (by id), stack and lock it was started from, and
on which host. Whoever starts a node (``kit cluster up``, the Slurm script, a KubeRay pod) puts it
in the node's environment as ``RLK_NODE_IDENTITY`` (JSON) and, shortened, as Ray node labels; the
per-node probe reads it back from every node and the rules below compare nodes (pure).

Example::

    ident = node_identity(name="c1-worker-1", image_ref="rlk-kit/smoke:cpu-1", image_id="sha256:ab…",
                          labels=image_labels, host="vm")
    ray_labels(ident)      # {'rlk-kit/node': 'c1-worker-1', 'rlk-kit/image': 'ab…', 'rlk-kit/stack': '…'}
"""

from __future__ import annotations

from kit.model.labels import LABEL_PREFIX

ENV = "RLK_NODE_IDENTITY"                     # set on the node (container environment)
EXPECTED_ENV = "RLK_EXPECTED_NODE_IDENTITY"   # set on the job: what every actor's node must declare
# Fields that must agree on every node of one cluster (host and name differ by design).
COMPARED = ("image_id", "stack_sha256", "inputs_sha256")
LABEL_VALUE_MAX = 63                          # Ray and Kubernetes label values


def node_identity(*, name: str, image_ref: str | None, image_id: str | None, labels: dict | None,
                  host: str | None, runtime: str = "docker") -> dict:
    """The identity a node declares, from the image it was started from."""
    labels = labels or {}
    return {"name": name, "runtime": runtime, "image_ref": image_ref, "image_id": image_id,
            "stack_name": labels.get(f"{LABEL_PREFIX}.stack.name"),
            "stack_sha256": labels.get(f"{LABEL_PREFIX}.stack.sha256"),
            "inputs_sha256": labels.get(f"{LABEL_PREFIX}.inputs.sha256"), "host": host}


def _short(value: str | None) -> str:
    text = (value or "none").split(":")[-1]
    return text[:32] if all(c in "0123456789abcdef" for c in text) else "".join(
        c if c.isalnum() or c in "-_." else "-" for c in text)[:LABEL_VALUE_MAX].strip("-_.") or "none"


def ray_labels(identity: dict) -> dict[str, str]:
    """Ray node labels (values ≤ 63 characters: hashes shortened to 32 hex digits)."""
    return {"rlk-kit/node": _short(identity.get("name")), "rlk-kit/image": _short(identity.get("image_id")),
            "rlk-kit/stack": _short(identity.get("stack_sha256")), "rlk-kit/inputs": _short(identity.get("inputs_sha256"))}


def labels_flag(identity: dict) -> str:
    """``ray start --labels`` value: ``k=v,k=v`` in sorted order."""
    return ",".join(f"{k}={v}" for k, v in sorted(ray_labels(identity).items()))


def node_name(node: dict) -> str:
    """How a probed node is named in messages: its Ray id, address and declared name."""
    declared = (node.get("node_identity") or {}).get("name")
    return f"node {node['node_id'][:12]} ({node.get('address')}{', ' + declared if declared else ''})"


def declared_problems(nodes: list[dict], stack_sha256: str) -> list[str]:
    """Nodes whose declared identity is missing on some, names another stack, or differs from the
    first node that declares one, field by field with both values (pure)."""
    declaring = [n for n in nodes if n.get("node_identity")]
    if not declaring:
        return []
    out = [f"{node_name(n)}: node_identity expected a declared identity ({ENV}), observed none"
           for n in nodes if not n.get("node_identity")]
    ref = declaring[0]
    for node in declaring:
        ident = node["node_identity"]
        if ident.get("stack_sha256") != stack_sha256:
            out.append(f"{node_name(node)}: node_identity.stack_sha256 expected {stack_sha256!r}, "
                       f"observed {ident.get('stack_sha256')!r}")
        if node is ref:
            continue
        for field in COMPARED:
            want, got = ref["node_identity"].get(field), ident.get(field)
            if field != "stack_sha256" and want != got:
                out.append(f"{node_name(node)}: node_identity.{field} expected {want!r} (as {node_name(ref)}), "
                           f"observed {got!r}")
    return out


def expected_for_actors(nodes: list[dict], packages: dict[str, str]) -> dict:
    """What every actor checks on its own node inside the job: the fields all probed nodes agreed on,
    and the stack's package versions."""
    first = next((n["node_identity"] for n in nodes if n.get("node_identity")), None)
    return {"node": {f: first.get(f) for f in COMPARED} if first else {}, "packages": dict(sorted(packages.items()))}
