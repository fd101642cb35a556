"""A run request and its outcome, and the checks a request must pass before anything is planned or started.

``kit run`` and ``kit suite`` build the same :class:`RunRequest` and go through the same
:func:`check_request`, so a flag combination one refuses the other refuses too. Example::

    check_request(RunRequest(arm=catalog.arm("smoke"), workspace=Path("ws"), runtime="docker", ray_head=True))
    # BadInput: --ray-head goes with --runtime local (the docker runtime has its own Ray)
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from pathlib import Path

from kit.build import layout as L
from kit.model.engine_traits import traits
from kit.model.errors import BadInput
from kit.adapters.ray import check_address
from kit.run.plan import TopologyOverrides, resolve_plan


INTERRUPTED_EXIT = 130


@dataclass(frozen=True)
class RunRequest:
    arm: object                       # kit.arm.Arm
    workspace: Path
    overrides: object = None          # kit.plan.TopologyOverrides
    runtime: str = "local"
    image: str | None = None
    ray_address: str | None = None
    network: str | None = None
    run_id: str | None = None
    rollouts: int | None = None
    detach: bool = False
    dry_run: bool = False
    allow_dirty: bool = False
    sign_key: Path | None = None
    ray_head: bool = False            # local: run as a Ray job on a head the kit starts and stops
    model: Path | None = None         # VIME arms: Hugging Face checkpoint dir, mounted read-only
    checkpoint: Path | None = None    # VIME arms: Megatron torch_dist dir, mounted read-only
    prompt_data: Path | None = None   # VIME arms: prompt JSONL (default: kit prepare's output in the workspace)
    reproduces: str | None = None     # kit reproduce: the original run (id, dir, seal root), recorded in kit.log
    claim: dict | None = None         # kit run --claim: the manifest's claim (name, sha256, role, seed)


@dataclass
class RunOutcome:
    run_id: str
    run_dir: Path | None
    status: str                        # planned | succeeded | failed | interrupted | detached
    job_status: str | None = None
    validation: dict | None = None
    seal: dict | None = None
    message: str = ""
    document: dict | None = None       # dry run: what would be written

    @property
    def sealed(self) -> bool:
        return self.seal is not None

    @property
    def exit_code(self) -> int:
        if self.status in ("planned", "detached"):
            return 0
        if self.status == "interrupted":
            return INTERRUPTED_EXIT
        return 0 if self.status == "succeeded" and self.validation and self.validation["passed"] else 1


def plan_for(request: RunRequest) -> dict:

    workspace = str(request.workspace.resolve()) if request.runtime == "local" else L.WORKSPACE
    run_id = request.run_id or default_run_id(request.arm, request.rollouts)
    return resolve_plan(request.arm, request.overrides or TopologyOverrides(), run_id=run_id,
                        rollouts=request.rollouts, workspace=workspace)


def default_run_id(arm, rollouts: int | None) -> str:
    """``kit.plan.default_run_id`` with the rollout count the run actually uses."""

    wl = arm.workload
    now = _dt.datetime.now(_dt.timezone.utc)
    return f"{arm.name.lower()}-n{rollouts or wl['rollouts']}-s{wl['seed']}-{now.strftime('%Y%m%dT%H%M%S%fZ')}"


# Flags that only one runtime reads: given to another, they would be silently ignored.
RUNTIME_ONLY_FLAGS = (("image", "--image", "docker"), ("network", "--network", "docker"),
                      ("ray_address", "--ray-address", "ray"))


def check_workspace(path: Path, source: str = "--workspace or KIT_WORKSPACE") -> None:
    """The workspace must be a directory or creatable as one: a file on its path is bad input."""
    path = Path(path)
    for candidate in (path, *path.parents):
        if candidate.exists():
            if not candidate.is_dir():
                where = "is a file" if candidate == path else f"lies under {candidate}, which is a file"
                raise BadInput(f"workspace {path} ({source}) {where}; give a directory (created when missing)")
            return


def check_request(request: RunRequest) -> None:
    """Refuse flag combinations that cannot mean what they say, before anything is planned or started."""
    for attr, flag, needs in RUNTIME_ONLY_FLAGS:
        if getattr(request, attr) and request.runtime != needs:
            raise BadInput(f"{flag} needs --runtime {needs}; the {request.runtime} runtime would ignore it "
                           f"(drop {flag} or add --runtime {needs})")
    if request.ray_address is not None:
        check_address(request.ray_address, "--ray-address")   # refused at once, not after the reach timeout
    if request.detach and request.runtime != "ray":
        raise BadInput("--detach needs --runtime ray: the local and docker runtimes stop what they started")
    if request.ray_head and request.runtime != "local":
        raise BadInput(f"--ray-head goes with --runtime local (the {request.runtime} runtime has its own Ray)")
    if request.runtime == "local" and not traits(request.arm.engine).runs_on_host:
        raise BadInput(f"--runtime local: arm {request.arm.name} is a {request.arm.engine} arm; its engines exist only "
                       f"in its image: use --runtime docker (kit build {request.arm.platform} --arm {request.arm.name}) "
                       "or --runtime ray")
    check_workspace(request.workspace)


def inputs_given(request: RunRequest) -> bool:
    return request.model is not None and request.checkpoint is not None
