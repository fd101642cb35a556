"""Build provenance: an in-toto v1 Statement with the SLSA provenance v1 predicate.

Says which image a build made (subject: the config digest before the provenance label is added,
and each layer's diff id) from exactly which inputs (resolvedDependencies: the base by id and its
Debian package list, every source by commit and tree, every wheel and patch by sha256, the kit by
its source sha256). It holds nothing that depends on when, where or by which engine the build
ran (those are in the build record), so equal inputs give an equal statement, an equal label and
an equal image id. Pure: no engine. Example::

    statement = image_provenance(plan, config_digest="sha256:…", layers=[…], base_packages=[…])
    sha256_of_document(statement)   # the value of the dev.rlk-kit.provenance.sha256 label
"""

from __future__ import annotations

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "https://rlk-kit.dev/build/image/v1"
BUILDER_ID = "https://rlk-kit.dev/builder/kit-build"
SCHEMA = "rlk-kit/slsa-provenance/v1"      # shipped schema of the statement (it has no 'schema' field)
LABEL = "dev.rlk-kit.provenance.sha256"


def _hex(digest: str) -> str:
    return digest.split(":", 1)[1] if ":" in digest else digest


def image_provenance(plan, *, config_digest: str, layers: list[dict], base_packages: list[dict],
                     kit_version: str, arm: str | None = None) -> dict:
    """The statement for ``plan`` (a :class:`kit.build.plan.BuildPlan`) and its normalized image."""
    subject = [{"name": f"{plan.tag}@config", "digest": {"sha256": _hex(config_digest)}}]
    subject += [{"name": f"{plan.tag}@layer/{i}", "digest": {"sha256": _hex(layer['diff_id'])}}
                for i, layer in enumerate(layers)]
    external = {"platform": plan.platform, "stack": {"name": plan.stack_name, "sha256": plan.stack_sha256},
                "dockerfile": plan.dockerfile}
    if arm:
        external["arm"] = arm
    return {
        "_type": STATEMENT_TYPE,
        "subject": subject,
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": external,
                "internalParameters": {"build_args": dict(plan.build_args), "inputs_sha256": plan.inputs_sha256},
                "resolvedDependencies": resolved_dependencies(plan, base_packages, kit_version),
            },
            "runDetails": {"builder": {"id": BUILDER_ID, "version": {"rlk-kit": kit_version}}},
        },
    }


def resolved_dependencies(plan, base_packages: list[dict], kit_version: str) -> list[dict]:
    """Base (id + packages), sources (commit, tree), the lock, wheels and patches (sha256), the kit itself."""
    out = []
    base = {"name": "base-image", "uri": plan.base_image,
            "annotations": {"packages": base_packages, "unresolved": plan.base_unresolved}}
    if plan.base_image_id:
        base["digest"] = {"sha256": _hex(plan.base_image_id)}
    elif "@sha256:" in plan.base_image:
        base["digest"] = {"sha256": plan.base_image.rsplit("@sha256:", 1)[1]}
    out.append(base)
    labels = plan.labels
    for key in sorted(labels):
        if key.startswith("dev.rlk-kit.source.") and key.endswith(".commit"):
            name = key[len("dev.rlk-kit.source."):-len(".commit")]
            entry = {"name": f"source/{name}", "digest": {"gitCommit": labels[key]}}
            repository = labels.get(f"dev.rlk-kit.source.{name}.repository")
            if repository:
                entry["uri"] = repository
            tree = labels.get(f"dev.rlk-kit.source.{name}.tree")
            if tree:
                entry["annotations"] = {"tree": tree}
            out.append(entry)
    for item in plan.context:
        kind = item.path.split("/", 1)[0]
        if item.digest.startswith("sha256:") and kind in ("wheelhouse", "patches") and not item.path.endswith("/"):
            out.append({"name": item.path, "digest": {"sha256": _hex(item.digest)}})
        elif item.path in ("lock.json", "stack.json"):
            out.append({"name": item.path, "digest": {"sha256": _hex(item.digest)}})
        elif item.path == plan.dockerfile:
            out.append({"name": f"dockerfile/{item.path}", "digest": {"sha256": _hex(item.digest)}})
    kit_sha = labels.get("dev.rlk-kit.kit.source-sha256")
    kit = {"name": "rlk-kit", "annotations": {"version": kit_version}}
    if kit_sha:
        kit["digest"] = {"sha256": kit_sha}
    out.append(kit)
    return out


def subject_layers(statement: dict) -> list[str]:
    """``["sha256:…", …]``: the layer diff ids a statement names, in image order."""
    out = []
    for item in statement.get("subject", []):
        if "@layer/" in item.get("name", ""):
            out.append("sha256:" + item["digest"]["sha256"])
    return out


def parse_package_list(text: str) -> list[dict]:
    """``name<TAB>version<TAB>sha256`` lines (docker/make-base-image.sh writes them) as dicts."""
    out = []
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) >= 2 and parts[0]:
            entry = {"name": parts[0], "version": parts[1]}
            if len(parts) > 2 and len(parts[2]) == 64:
                entry["sha256"] = parts[2]
            out.append(entry)
    return out
