"""The local runtime: an engine's workload in this process, on this host (smoke, gpu: traits.runs_on_host).

Nothing is started and no image is involved, so the host's observed identity is recorded together
with its differences from the stack (they are expected here: the host is not the pinned image) and
never refused; published evidence comes from the docker and ray runtimes. A VIME arm is refused:
its engines exist only inside its image. Example::

    rt = LocalRuntime(arm=arm)
    rt.preflight(); rt.submit(spec); rt.follow(emit=print, should_stop=lambda: False)   # "SUCCEEDED"
"""

from __future__ import annotations

import importlib
import sys
import traceback
from typing import Callable

from kit.build.probe import identity_differences, observed_identity
from kit.engines import get_engine
from kit.model.errors import BadInput
from kit.runtimes.base import JobSpec, Runtime, gpu_info, host_info


class LocalRuntime(Runtime):
    kind = "local"

    def __init__(self, *, arm, **_):
        self.arm = arm
        self.engine = get_engine(arm.engine)
        self.spec: JobSpec | None = None
        self._observed = None
        self._differences: list = []
        self._arm_doc: dict | None = None
        self._stop_requested = False

    def preflight(self) -> None:
        if not self.engine.traits.runs_on_host:
            raise BadInput(f"--runtime local: arm {self.arm.name} is a {self.arm.engine} arm; its engines exist only in "
                           f"its image: run it with --runtime docker (kit build {self.arm.platform} --arm {self.arm.name}) "
                           "or --runtime ray")
        try:
            importlib.import_module(self.engine.in_process_module)
        except ImportError as exc:
            raise BadInput(f"--runtime local: the {self.arm.engine} workload is not importable ({exc}); "
                           "pip install -e . first") from None
        self._observed = observed_identity(self.arm.stack.document)
        self._differences = [list(d) for d in identity_differences(self._observed, self.arm.stack.document)]

    def describe(self) -> dict:
        runtime = {"kind": self.kind, "in_process": True,
                   "note": "the host is not the pinned image; identity differences are recorded, not refused"}
        accelerator = self.engine.host_identity(gpu_info())   # gpu: device, CUDA, Triton, kernel fingerprint
        if accelerator is not None:
            runtime["accelerator"] = accelerator
        return {"runtime": runtime,
                "image": None, "observed_identity": self._observed, "identity_differences": self._differences,
                "host": host_info(), "gpus": gpu_info(), "ray_cluster": None}

    def job_argv(self, plan: dict, host_run_dir: str) -> list[str]:
        # recorded as the equivalent standalone command on this host
        return [sys.executable, *plan["command"]["argv"][1:]]

    def set_arm_document(self, doc: dict) -> None:
        self._arm_doc = doc   # the in-process workload reads it instead of the run dir's arm.json

    def submit(self, spec: JobSpec) -> None:
        self.spec = spec

    def follow(self, emit: Callable[[str], None], should_stop: Callable[[], bool]) -> str:
        stop = lambda: should_stop() or self._stop_requested  # noqa: E731
        lines = lambda line: [emit(part) for part in str(line).split("\n")]  # noqa: E731
        try:
            self.engine.run_in_process(self._arm_doc, emit=lines, should_stop=stop)
        except Exception:
            # the workload's own failure is engine output: it goes into the job log like a Ray job's stderr
            for line in traceback.format_exc().rstrip("\n").split("\n"):
                emit(line)
            return "FAILED"
        return "STOPPED" if stop() else "SUCCEEDED"

    def stop_job(self) -> None:
        self._stop_requested = True
