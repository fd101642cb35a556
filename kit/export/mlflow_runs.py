"""One MLflow run per kit run: params, per-step metrics, tags and the evidence as artifacts.

MLflow's own client writes the store (imported lazily: it is heavy). The run directory is only
read: files are copied into the artifact store, never moved or touched. Example::

    from kit.analysis.table import load_arms
    result = export_runs(load_arms([Path("runs/a"), Path("runs/b")]), "sqlite:///mlflow.db", "rlk-kit")
    result["runs"][0]["mlflow_run_id"]
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
from pathlib import Path
from urllib.parse import urlparse

from kit.analysis.comparability import CONTROLLED_LABEL, DESCRIPTIVE_LABEL, assess
from kit.analysis.table import manifest_arm, manifest_workload
from kit.model.errors import BadInput, CheckFailed

SCHEMA = "rlk-kit/export-mlflow/v2"
EVIDENCE_FILES = ("manifest.json", "seal.json", "validation.json", "status.json", "arm.json")
FIGURE_SUFFIXES = (".png", ".pdf")
BATCH = 1000        # MLflow's limit of metrics per log_batch call


def _str(value) -> str:
    return "" if value is None else str(value)


def run_params(arm) -> dict[str, str]:
    """Params of one run: arm, stack hash (the lock), image digest, topology, seeds; '' when unknown."""
    manifest = arm.manifest or {}
    doc = manifest_arm(manifest) if manifest else {}
    workload = manifest_workload(manifest) if manifest else {}
    stack = manifest.get("stack") if isinstance(manifest.get("stack"), dict) else {}
    image = manifest.get("image") if isinstance(manifest.get("image"), dict) else {}
    topology = manifest.get("topology") if isinstance(manifest.get("topology"), dict) else doc.get("topology") or {}
    params = {
        "arm": arm.name, "run_id": _str(manifest.get("run_id")), "arm_sha256": _str(manifest.get("arm_sha256")),
        "stack": _str(stack.get("name")), "stack_sha256": _str(stack.get("sha256")),
        "image_ref": _str(image.get("ref") or image.get("tag")),
        "image_digest": _str(image.get("digest") or image.get("repo_digest") or image.get("id")),
        "seed": _str(workload.get("seed")), "rollout_seed": _str(workload.get("rollout_seed")),
        "global_batch_size": _str(arm.global_batch_size), "kit_version": _str(manifest.get("kit_version")),
        "log": str(arm.log_path),
    }
    for key in ("gpus", "tp", "cp", "pp", "rollout_tp", "rollout_cp"):
        if key in topology:
            params[f"topology.{key}"] = _str(topology[key])
    return params


def run_metrics(arm) -> list[tuple[str, float, int]]:
    """(key, value, step) of every finite numeric value of every record of every step."""
    out = []
    for step, records in arm.steps.items():
        seen = {}
        for payload in records.payloads.values():
            for key, value in payload.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                    seen.setdefault(key, float(value))
        out += [(key, value, step) for key, value in sorted(seen.items())]
    return out


def run_tags(arm, verdict, reference: str) -> dict[str, str]:
    """Trust level (kit verify's result) and the controlled-comparison verdict against the first run."""
    if arm.manifest is None:
        trust = "bare log"
    else:
        trust = "failed verification" if arm.evidence_problems else "verified"
    pair = verdict.pair(arm.name)
    if arm.name == reference:
        comparison = "reference" if len(verdict.pairs) else "single run"
    else:
        comparison = CONTROLLED_LABEL if pair is not None and pair.controlled else DESCRIPTIVE_LABEL
    tags = {"kit.trust": trust, "kit.comparison": comparison, "kit.comparison_reference": reference,
            "kit.source": str(arm.run_dir or arm.log_path)}
    if arm.evidence_problems:
        tags["kit.verification_problems"] = "; ".join(arm.evidence_problems)[:5000]
    if pair is not None and pair.reasons:
        tags["kit.comparison_reasons"] = "; ".join(pair.reasons)[:5000]
    return tags


def run_identity(arm) -> tuple[str, str]:
    """(kit run id, seal sha256) that find an earlier export of this run: the manifest's run id and the
    seal's bytes; a bare log has no run id and is known by its own bytes."""
    manifest = arm.manifest or {}
    seal = arm.run_dir / "seal.json" if arm.run_dir is not None else None
    source = seal if seal is not None and seal.is_file() else arm.log_path
    return _str(manifest.get("run_id")), hashlib.sha256(Path(source).read_bytes()).hexdigest()


def _quoted(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def find_exported(client, experiment_id: str, run_id: str, seal_sha256: str):
    """The MLflow runs of the experiment that carry this kit run id (or, for a bare log, this seal)."""
    key = f"tags.`kit.run_id` = {_quoted(run_id)}" if run_id else f"tags.`kit.seal_sha256` = {_quoted(seal_sha256)}"
    return client.search_runs([experiment_id], filter_string=key, max_results=100)


def allow_file_store(tracking_uri: str) -> None:
    """MLflow 3 refuses a file store unless MLFLOW_ALLOW_FILE_STORE is set; a user who names one
    (file://… or a plain path) has chosen it, so the kit's own process allows it. An explicit
    MLFLOW_ALLOW_FILE_STORE=false in the environment is kept."""
    if urlparse(tracking_uri).scheme in ("", "file"):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")


def evidence_files(arm, figures_dir: Path | None) -> list[tuple[Path, str]]:
    """(file, artifact folder) pairs: the run's evidence documents and log, and the figures given."""
    files = []
    if arm.run_dir is not None:
        files += [(arm.run_dir / name, "evidence") for name in EVIDENCE_FILES if (arm.run_dir / name).is_file()]
    files.append((arm.log_path, "evidence"))
    if figures_dir is not None:
        files += [(p, "figures") for p in sorted(figures_dir.iterdir()) if p.suffix in FIGURE_SUFFIXES and p.is_file()]
    return files


def export_runs(arms, tracking_uri: str, experiment: str, figures_dir: Path | None = None,
                artifact_root: Path | None = None, progress=None) -> dict:
    """Write one MLflow run per arm into the store at ``tracking_uri``; returns the export-mlflow/v2 document.

    A kit run already in the experiment under the same run id and seal is skipped (exporting twice
    makes no duplicate); one under the same run id with another seal is refused (CheckFailed).
    MLflow's own errors become one BadInput naming --tracking-uri."""
    allow_file_store(tracking_uri)
    from mlflow.exceptions import MlflowException

    try:
        return _export(arms, tracking_uri, experiment, figures_dir, artifact_root, progress)
    except MlflowException as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise BadInput(f"--tracking-uri {tracking_uri}: MLflow refused the store: {first[:400]}") from None


def _export(arms, tracking_uri, experiment, figures_dir, artifact_root, progress) -> dict:
    import mlflow
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    for name in ("mlflow", "alembic"):     # their store-migration INFO lines are not the user's business
        logging.getLogger(name).setLevel(logging.WARNING)

    names = [a.name for a in arms]
    if len(set(names)) != len(names):
        raise BadInput("two runs share an arm name; give each a distinct one with --name")
    verdict = assess(arms, None)
    client = MlflowClient(tracking_uri=tracking_uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        location = artifact_root.resolve().as_uri() if artifact_root is not None else None
        experiment_id = client.create_experiment(experiment, artifact_location=location)
    else:
        experiment_id = found.experiment_id
    out = []
    for arm in arms:
        if progress:
            progress(f"exporting {arm.name} ({arm.run_dir or arm.log_path})")
        params, tags = run_params(arm), run_tags(arm, verdict, names[0])
        kit_run_id, seal_sha256 = run_identity(arm)
        tags.update({"kit.run_id": kit_run_id, "kit.seal_sha256": seal_sha256} if kit_run_id else
                    {"kit.seal_sha256": seal_sha256})
        metrics = run_metrics(arm)
        entry = {"arm": arm.name, "source": str(arm.run_dir or arm.log_path), "params": params, "tags": tags,
                 "metric_keys": sorted({k for k, _, _ in metrics}), "metric_values": len(metrics),
                 "steps": len(arm.steps)}
        earlier = find_exported(client, experiment_id, kit_run_id, seal_sha256)
        same = [r for r in earlier if r.data.tags.get("kit.seal_sha256") == seal_sha256]
        if same:
            if progress:
                progress(f"{arm.name}: already exported as MLflow run {same[0].info.run_id} "
                         f"(kit run {kit_run_id or 'bare log'}, seal sha256 {seal_sha256[:12]}); skipped")
            out.append({**entry, "mlflow_run_id": same[0].info.run_id, "action": "skipped",
                        "artifacts": [f"{f}/{p.name}" for p, f in evidence_files(arm, figures_dir)]})
            continue
        if earlier:
            other = earlier[0]
            raise CheckFailed(f"{entry['source']}: kit run {kit_run_id} is already in experiment {experiment} as "
                              f"MLflow run {other.info.run_id} with seal sha256 "
                              f"{other.data.tags.get('kit.seal_sha256', '(none)')}, but this run dir's seal is "
                              f"{seal_sha256}: the run was re-sealed or is another run under the same id; "
                              f"not exported (use another --experiment to keep both)")
        run = client.create_run(experiment_id, run_name=arm.name, tags={"mlflow.runName": arm.name})
        run_id = run.info.run_id
        client.log_batch(run_id, params=[Param(k, v) for k, v in params.items()],
                         tags=[RunTag(k, v) for k, v in tags.items()])
        for i in range(0, len(metrics), BATCH):
            client.log_batch(run_id, metrics=[Metric(k, v, 0, s) for k, v, s in metrics[i:i + BATCH]])
        artifacts = []
        for path, folder in evidence_files(arm, figures_dir):
            client.log_artifact(run_id, str(path), artifact_path=folder)
            artifacts.append(f"{folder}/{path.name}")
        client.set_terminated(run_id, "FINISHED")
        out.append({**entry, "mlflow_run_id": run_id, "action": "created", "artifacts": artifacts})
    return {"schema": SCHEMA, "tracking_uri": tracking_uri, "experiment": experiment,
            "experiment_id": experiment_id, "mlflow_version": mlflow.__version__, "runs": out}
