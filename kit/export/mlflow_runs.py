"""One MLflow run per kit run: params, per-step metrics, tags and the evidence as artifacts.

MLflow's own client writes the store (imported lazily: it is heavy). The run directory is only
read: files are copied into the artifact store, never moved or touched. Example::

    from kit.analysis.table import load_arms
    result = export_runs(load_arms([Path("runs/a"), Path("runs/b")]), "sqlite:///mlflow.db", "rlk-kit")
    result["runs"][0]["mlflow_run_id"]
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

from kit.analysis.comparability import CONTROLLED_LABEL, DESCRIPTIVE_LABEL, assess
from kit.analysis.table import manifest_arm, manifest_workload
from kit.model.errors import BadInput

SCHEMA = "rlk-kit/export-mlflow/v1"
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
    """Write one MLflow run per arm into the store at ``tracking_uri``; returns the export-mlflow/v1 document."""
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
        run = client.create_run(experiment_id, run_name=arm.name, tags={"mlflow.runName": arm.name})
        run_id = run.info.run_id
        metrics = run_metrics(arm)
        client.log_batch(run_id, params=[Param(k, v) for k, v in params.items()],
                         tags=[RunTag(k, v) for k, v in tags.items()])
        for i in range(0, len(metrics), BATCH):
            client.log_batch(run_id, metrics=[Metric(k, v, 0, s) for k, v, s in metrics[i:i + BATCH]])
        artifacts = []
        for path, folder in evidence_files(arm, figures_dir):
            client.log_artifact(run_id, str(path), artifact_path=folder)
            artifacts.append(f"{folder}/{path.name}")
        client.set_terminated(run_id, "FINISHED")
        out.append({"arm": arm.name, "source": str(arm.run_dir or arm.log_path), "mlflow_run_id": run_id,
                    "params": params, "tags": tags, "metric_keys": sorted({k for k, _, _ in metrics}),
                    "metric_values": len(metrics), "steps": len(arm.steps), "artifacts": artifacts})
    return {"schema": SCHEMA, "tracking_uri": tracking_uri, "experiment": experiment,
            "experiment_id": experiment_id, "mlflow_version": mlflow.__version__, "runs": out}
