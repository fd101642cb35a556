"""The end of a run: collect the metrics, judge the gates, write the status and seal — the same for a
waited run and for an attached one. Example::

    outcome = finish_run(run_dir, logs, run_id="r1", arm_doc=arm, inputs={}, status="succeeded", ...)
    outcome.sealed      # True when the job succeeded (gates passed or not: the seal records which)
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

from kit.engines.vime.records import parse_records
from kit.evidence import bundle as E
from kit.evidence.redact import Redactor
from kit.gates.engine import GATE_SET_VERSION, evaluate
from kit.gates.rules import RunEvidence
from kit.model.documents import schema_id
from kit.model.holds import hold
from kit.run.logs import RunLogs
from kit.run.manifest import metrics_lines
from kit.run.request import RunOutcome


def run_ending(job_status: str, signal_received: int | None) -> tuple[str, str]:
    """(run status, message) from the job's terminal status and whether Ctrl-C/SIGTERM arrived."""
    if signal_received is not None:
        return "interrupted", f"stopped by signal {signal.Signals(signal_received).name}"
    if job_status == "SUCCEEDED":
        return "succeeded", ""
    return "failed", ("the cluster or container stopped answering" if job_status == "LOST" else f"job ended {job_status}")


def status_document(run_id, status, job_status, submission_id, message, timing, job_info, redactor) -> dict:
    return redact_status({
        "schema": schema_id("run-status"), "run_id": run_id, "status": status, "job_status": job_status,
        "submission_id": submission_id, "message": message, "finished_at": E.utc_now(), "timing": timing,
        "job_info": job_info}, redactor)


def finish_run(run_dir: Path, logs: RunLogs, *, run_id, arm_doc, inputs, status, job_status, message, submission_id,
            timing, job_info, private_key, replace_status: bool) -> RunOutcome:
    """collect → validate → status → seal: the same for a waited run and for an attached one."""
    E.write_new_text(run_dir, E.METRICS, metrics_lines(parse_records(logs.engine_lines)))
    ev = RunEvidence(arm=arm_doc, job_status=job_status or "", engine_lines=logs.engine_lines, inputs=inputs,
                     readbacks=tuple(read_readbacks(run_dir)))
    hold("validation")
    report = evaluate(ev, run_id=run_id)
    E.write_document(run_dir, E.VALIDATION, report)
    hold("status")
    if status == "succeeded" and not report["passed"]:
        message = "gates failed: " + ", ".join(g["id"] for g in report["gates"] if g["status"] == "failed")
    logs.kit_event(f"status {status}" + (f": {message}" if message else ""))
    logs.kit_log.close()
    doc = status_document(run_id, status, job_status, submission_id, message, timing, job_info, logs.redactor)
    if replace_status:
        E.replace_status(run_dir, doc)
    else:
        E.write_document(run_dir, E.STATUS, doc)
    seal = None
    if status == "succeeded":
        seal = E.seal_run_dir(run_dir, run_id=run_id, validation_passed=report["passed"],
                              gate_set_version=GATE_SET_VERSION, private_key=private_key)
    return RunOutcome(run_id, run_dir, status, job_status, report, seal, message)


def timing(total_s: float, workload_s: float) -> dict:
    """The status document's timing: the whole run, the job's own part, and the kit's (the rest)."""
    return {"total_s": round(total_s, 3), "workload_s": round(workload_s, 3), "kit_s": round(total_s - workload_s, 3)}


def redact_status(doc: dict, redactor: Redactor) -> dict:
    return redactor.document(json.loads(json.dumps(doc, default=str)))


def read_readbacks(run_dir: Path) -> list[tuple[str, dict]]:
    out = []
    for path in sorted((run_dir / "readbacks").glob("*.json")) if (run_dir / "readbacks").is_dir() else []:
        try:
            out.append((path.name, json.loads(path.read_text(encoding="utf-8"))))
        except (OSError, ValueError):
            out.append((path.name, {"unreadable": True}))
    return out
