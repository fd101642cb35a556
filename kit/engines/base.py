"""The Engine protocol: everything the kit does differently per engine, behind one interface.

An engine is the program a run's job executes (the smoke workload, VIME's train.py). Each one lives in
``kit/engines/<name>/`` and gives: its traits (:mod:`kit.model.engine_traits`), what it needs of a host,
the job's command, its log parser and the log keys that parser knows, and the gates its runs need.
Example::

    engine = get_engine("vime")                       # kit.engines
    cmd = engine.command(doc, layout, stack, run_id="r1", run_dir="/workspace/runs/r1", capture_sizes=[1, 2])
    cmd.argv[:2]                                      # ['/opt/rlk/venv/bin/python', 'train.py']
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Protocol

from kit.model.engine_traits import EngineTraits

GiB = 1 << 30


@dataclass(frozen=True)
class HostNeeds:
    """What a host must have free for the engine's arms (``kit doctor``), and why."""

    shm_bytes: int
    shm_reason: str
    disk_bytes: int
    disk_reason: str


@dataclass(frozen=True)
class EngineCommand:
    """The job's complete command line and environment, as the plan records them."""

    argv: list[str]
    env: dict[str, str]
    working_dir: str
    entrypoint_appended: list[str] = field(default_factory=list)
    record: dict | None = None             # plan.command extras (e.g. the launcher revision followed)
    metadata: dict[str, str] = field(default_factory=dict)    # extra Ray job metadata


@dataclass(frozen=True)
class CaptureSizes:
    """Capture sizes an engine revision fixes whatever the arm says, and who fixes them (for the message)."""

    sizes: list[int]
    fixed_by: str


class Engine(Protocol):
    traits: EngineTraits
    needs: HostNeeds
    gates: tuple[str, ...]          # ids of the gates its runs are judged by (beyond those that apply to all)
    in_process_module: str | None   # the workload's module when it runs in the kit's process (traits.runs_on_host)
    log_keys: tuple[str, ...]       # the metric keys its log parser reads

    def plan_problems(self, doc: dict, stack) -> list[tuple[str, str]]:
        """Arm settings this engine (at the stack's revision) cannot run, as (pointer, message)."""

    def fixed_capture_sizes(self, doc: dict, stack) -> CaptureSizes | None:
        """Capture sizes the engine fixes for this arm, or None when the arm's rule decides."""

    def adjust_layout(self, layout: dict, doc: dict, stack) -> None:
        """Change the derived layout where the engine's revision does things its own way."""

    def command(self, doc: dict, layout: dict, stack, *, run_id: str, run_dir: str,
                capture_sizes: list[int]) -> EngineCommand:
        """The job's command for a resolved arm document."""

    def parse_records(self, lines: Iterable[str], unparseable: list | None = None) -> Iterator:
        """The metric records (kit.engines.vime.records.Record) of its log lines."""

    def workload_inputs(self, doc: dict) -> dict:
        """The manifest's ``inputs`` of a workload with built-in inputs (traits.uses_input_files is False)."""

    def run_in_process(self, doc: dict, emit: Callable[[str], None], should_stop: Callable[[], bool]) -> None:
        """Run the workload here (traits.runs_on_host): the local runtime's job."""

    def host_identity(self, gpus: dict) -> dict | None:
        """What the engine adds to the local runtime's record of the host it ran on (None: nothing)."""


class EngineBase:
    """Defaults shared by the engines: no plan problems, no fixed capture sizes, the layout as derived."""

    traits: EngineTraits
    needs: HostNeeds
    gates: tuple[str, ...] = ()
    log_keys: tuple[str, ...] = ()
    in_process_module: str | None = None
    ray_actor_flag: str | None = None   # the flag that makes its workload Ray actors (smoke: --ray)

    @property
    def name(self) -> str:
        return self.traits.name

    def plan_problems(self, doc: dict, stack) -> list[tuple[str, str]]:
        return []

    def fixed_capture_sizes(self, doc: dict, stack) -> CaptureSizes | None:
        return None

    def adjust_layout(self, layout: dict, doc: dict, stack) -> None:
        return None

    def workload_inputs(self, doc: dict) -> dict:
        raise NotImplementedError(f"the {self.name} engine reads its inputs from files (kit prepare)")

    def run_in_process(self, doc: dict, emit: Callable[[str], None], should_stop: Callable[[], bool]) -> None:
        raise NotImplementedError(f"the {self.name} engine runs only in its image")

    def host_identity(self, gpus: dict) -> dict | None:
        return None



def submission_id(run_id: str) -> str:
    """Ray submission id of a run: one per run id, never a fixed prefix tied to a rollout count."""
    return f"rlk-{run_id}"
