"""The ray runtime: an existing cluster at ``--ray-address`` (the dashboard URL).

Before the arm's job is submitted, a probe job runs the probe on every alive node, pinned with
``NodeAffinitySchedulingStrategy(node_id, soft=False)``; any node that differs from the stack or
from the other nodes is refused, naming the node and the fields. Everything goes through the Jobs
API, so the kit's host needs no route to the cluster's internal ports. The smoke arm's arm.json
reaches the cluster as the job's uploaded ``working_dir``. Example::

    rt = RayRuntime(arm=arm, ray_address="http://head:8265", run_id="r1")
    rt.preflight()        # probe job on every node, refuses on any difference
"""

from __future__ import annotations

import json
import shlex
import tempfile
import shutil
from pathlib import Path

from kit.adapters.ray import NAMED_CLUSTER_TIMEOUT_S, NODE_PROBE_SCRIPT, PROBE_MARKER, RayJob, wait_for_jobs_api
from kit.build import layout as L
from kit.model import node_identity as NI
from kit.engines import get_engine
from kit.model.engine_traits import traits
from kit.model.errors import BadInput, CheckFailed
from kit.runtimes.base import JobSpec, RayJobRuntime, gpu_info, host_info
from kit.evidence.compare import flatten
from kit.build.probe import identity_differences
from dataclasses import replace
from kit.model.documents import sha256_of_document
from kit.model.stack import packages_for, stack_identity
from kit.build.probe import observed_platform

# Fields that differ between healthy nodes of one cluster.
NODE_VOLATILE = ("observed_at", "hostname")


def node_problems(nodes: list[dict], stack_doc: dict) -> list[str]:
    """Every node that differs from the stack or from the first node, with the fields (pure)."""

    out = []
    for node in nodes:
        label = NI.node_name(node)
        for field, expected, observed in identity_differences(node["identity"], stack_doc):
            out.append(f"{label}: {field} expected {expected!r}, observed {observed!r}")
    if len(nodes) > 1:
        def view(n):
            return flatten({k: v for k, v in n["identity"].items() if k not in NODE_VOLATILE})
        ref = view(nodes[0])
        for node in nodes[1:]:
            other = view(node)
            for path in sorted(set(ref) | set(other)):
                if ref.get(path) != other.get(path):
                    out.append(f"{NI.node_name(node)} differs from {NI.node_name(nodes[0])}: {path}")
    return out + NI.declared_problems(nodes, stack_sha256(stack_doc))


def stack_sha256(stack_doc: dict) -> str:

    return sha256_of_document(stack_identity(stack_doc))


class RayRuntime(RayJobRuntime):
    kind = "ray"

    def __init__(self, *, arm, ray_address: str | None, run_id: str, python: str = L.PYTHON, **_):
        if not ray_address:
            raise BadInput("--runtime ray needs --ray-address URL (the dashboard, for example http://head:8265)")
        if not ray_address.startswith(("http://", "https://")):
            raise BadInput(f"--ray-address {ray_address}: give the dashboard URL, for example http://head:8265")
        self.arm = arm
        self.address = ray_address.rstrip("/")
        self.run_id = run_id
        self.python = python
        self.cluster: dict | None = None
        self.job: RayJob | None = None
        self._staging: str | None = None

    def probe_cluster(self) -> dict:
        """Run the probe on every alive node through one Jobs API job; the cluster's facts and identities."""
        wait_for_jobs_api(self.address, timeout_s=30)
        probe = RayJob(self.address)
        lines: list[str] = []
        spec = JobSpec(submission_id=f"rlk-probe-{self.run_id}", entrypoint=f"{self.python} -c {shlex.quote(NODE_PROBE_SCRIPT)}",
                       argv=[self.python, "-c", NODE_PROBE_SCRIPT],
                       env_vars={"KIT_PROBE_STACK": json.dumps(self.arm.stack.document), "RAY_USAGE_STATS_ENABLED": "0"},
                       metadata={"purpose": "per-node probe", "run_id": self.run_id})
        probe.submit(spec)
        status = probe.follow(lines.append, lambda: False)
        found = [line[line.index(PROBE_MARKER) + len(PROBE_MARKER):] for line in lines if PROBE_MARKER in line]
        if status != "SUCCEEDED" or not found:
            tail = "\n".join(lines[-15:])
            raise CheckFailed(f"the per-node probe job on {self.address} ended {status}:\n{tail}")
        return json.loads(found[-1])

    def reach(self, unreachable=None) -> None:
        """Wait (briefly) for the cluster's Jobs API. An address the user named that nothing answers on is
        bad input (exit 2), like an absent Docker engine; ``unreachable`` words that error for the caller."""
        wait_for_jobs_api(self.address, timeout_s=NAMED_CLUSTER_TIMEOUT_S, unreachable=unreachable or (lambda m: BadInput(
            f"--ray-address {self.address}: cannot be reached ({m}); give the dashboard URL of a running cluster")))

    def preflight(self) -> None:
        self.reach()
        self.cluster = self.probe_cluster()
        problems = node_problems(self.cluster["nodes"], self.arm.stack.document)
        if problems:
            raise CheckFailed(f"the Ray cluster at {self.address} is not homogeneous with stack {self.arm.stack.name}:\n  "
                              + "\n  ".join(problems[:30]))

    def describe(self) -> dict:
        nodes = [{k: v for k, v in n.items() if k != "identity"} | {
                     "identity_stack": n["identity"].get("stack"),
                     "conformance_fingerprint": n["identity"].get("conformance_fingerprint")}
                 for n in self.cluster["nodes"]]
        cluster = {"version": self.cluster["version"], "address": self.address, "nodes": nodes,
                   "resources": self.cluster["resources"], "start_command": None,
                   "actor_identity_check": self.actor_check(),
                   "note": "an existing cluster: the kit did not start it; every alive node was probed and matched the stack"}
        head = self.cluster["nodes"][0]["identity"] if self.cluster["nodes"] else None
        return {"runtime": {"kind": self.kind, "address": self.address, "nodes_probed": len(nodes)},
                "image": None, "observed_identity": head, "identity_differences": [],
                "host": host_info(), "gpus": gpu_info(), "ray_cluster": cluster}

    def job_argv(self, plan: dict, host_run_dir: str) -> list[str]:
        argv = list(plan["command"]["argv"])
        if traits(self.arm.engine).reads_arm_file and "--arm-file" in argv:
            # the cluster cannot see the run dir: arm.json travels as the uploaded working_dir
            argv[argv.index("--arm-file") + 1] = "arm.json"
            self._staging = tempfile.mkdtemp(prefix="rlk-job-")
            shutil.copy(Path(host_run_dir) / "arm.json", Path(self._staging) / "arm.json")
        flag = get_engine(self.arm.engine).ray_actor_flag
        if flag and flag not in argv:
            argv.append(flag)   # rollout and trainer as actors of the cluster, on different nodes when it has several
        return argv

    def actor_check(self) -> dict | None:
        """What every actor of the job checks on its own node (nodes that declared an identity only):
        a node that joined after the probe fails the job with the probe's message."""
        nodes = (self.cluster or {}).get("nodes", [])
        if not any(n.get("node_identity") for n in nodes):
            return None

        platform = observed_platform(nodes[0]["identity"])
        return {"env": NI.EXPECTED_ENV,
                "expected": NI.expected_for_actors(nodes, packages_for(self.arm.stack.document, platform))}

    def submit(self, spec: JobSpec) -> None:

        if self._staging:
            spec = replace(spec, working_dir=self._staging)
        check = self.actor_check()
        if check:
            spec = replace(spec, env_vars={**spec.env_vars, check["env"]: json.dumps(check["expected"], sort_keys=True)})
        self.job = RayJob(self.address)
        self.job.submit(spec)

    def close(self) -> None:
        if self._staging:
            shutil.rmtree(self._staging, ignore_errors=True)
