"""The local runtime: the embedded smoke workload, or the gpu engine's GRPO workload, in this process, on this host.

Nothing is started and no image is involved, so the host's observed identity is recorded together
with its differences from the stack (they are expected here: the host is not the pinned image) and
never refused; published evidence comes from the docker and ray runtimes. A VIME arm is refused:
its engines exist only inside its image. Example::

    rt = LocalRuntime(arm=arm)
    rt.preflight(); rt.submit(spec); rt.follow(emit=print, should_stop=lambda: False)   # "SUCCEEDED"
"""

from __future__ import annotations

import sys
import traceback
from typing import Callable

from kit.engines import gpu as gpu_engine
from kit.model.errors import BadInput
from kit.runtimes import JobSpec, Runtime, gpu_info, host_info

# engines whose workload runs in this process: the module that must import
IN_PROCESS = {"smoke": "rlk_kernels.smoke", "gpu": "rlk_kernels.grpo.run"}


class LocalRuntime(Runtime):
    kind = "local"

    def __init__(self, *, arm, **_):
        self.arm = arm
        self.spec: JobSpec | None = None
        self._observed = None
        self._differences: list = []
        self._arm_doc: dict | None = None
        self._stop_requested = False

    def preflight(self) -> None:
        if self.arm.engine not in IN_PROCESS:
            raise BadInput(f"--runtime local: arm {self.arm.name} is a {self.arm.engine} arm; its engines exist only in "
                           f"its image: run it with --runtime docker (kit build {self.arm.platform} --arm {self.arm.name}) "
                           "or --runtime ray")
        try:
            __import__(IN_PROCESS[self.arm.engine])
        except ImportError as exc:
            raise BadInput(f"--runtime local: the {self.arm.engine} workload is not importable ({exc}); "
                           "pip install -e . first") from None
        try:
            from kit.build.probe import identity_differences, observed_identity
            self._observed = observed_identity(self.arm.stack.document)
            self._differences = [list(d) for d in identity_differences(self._observed, self.arm.stack.document)]
        except ImportError:
            self._observed, self._differences = None, []

    def describe(self) -> dict:
        runtime = {"kind": self.kind, "in_process": True,
                   "note": "the host is not the pinned image; identity differences are recorded, not refused"}
        if self.arm.engine == "gpu":   # the GPU host's own identity: device, CUDA, Triton, kernel fingerprint
            runtime["accelerator"] = gpu_engine.accelerator_identity(gpu_info())
        return {"runtime": runtime,
                "image": None, "observed_identity": self._observed, "identity_differences": self._differences,
                "host": host_info(), "gpus": gpu_info(), "ray_cluster": None}

    def job_argv(self, plan: dict, host_run_dir: str) -> list[str]:
        # recorded as the equivalent standalone command on this host
        return [sys.executable, *plan["command"]["argv"][1:]]

    def set_arm_document(self, doc: dict) -> None:
        self._arm_doc = doc

    def submit(self, spec: JobSpec) -> None:
        self.spec = spec

    def follow(self, emit: Callable[[str], None], should_stop: Callable[[], bool]) -> str:
        stop = lambda: should_stop() or self._stop_requested  # noqa: E731
        lines = lambda line: [emit(part) for part in str(line).split("\n")]  # noqa: E731
        try:
            if self.arm.engine == "gpu":
                gpu_engine.run_in_process(self._arm_doc, emit=lines, should_stop=stop)
            else:
                from rlk_kernels.smoke import SmokeConfig, run_smoke
                run_smoke(SmokeConfig.from_arm(self._arm_doc), emit=lines, should_stop=stop)
        except Exception:
            # the workload's own failure is engine output: it goes into the job log like a Ray job's stderr
            for line in traceback.format_exc().rstrip("\n").split("\n"):
                emit(line)
            return "FAILED"
        return "STOPPED" if stop() else "SUCCEEDED"

    def stop_job(self) -> None:
        self._stop_requested = True
