"""Import checks inside an image: the stack's frameworks and the kit's strict kernels, no GPU needed.

The probe proves versions and files; an import proves that a framework's native libraries load
(torch's CUDA runtime wheels, Transformer Engine's core library, vLLM's compiled ops) on this
base's glibc and Python. What needs a driver and a device cannot be checked on a host without a
GPU and is named instead (:data:`NEEDS_GPU`). Example::

    targets = import_targets(stack_doc, "cuda-debian")   # ["torch", "vllm", …, "rlk_kernels.ops"]
    results = run_import_checks(client, "rlk-kit/vime-base-debian:cuda-debian-…", targets)
    [r for r in results if not r["ok"]]                   # []
"""

from __future__ import annotations

import json

from kit.model.errors import CheckFailed
from kit.model.stack import packages_for

# Distribution -> the module that proves it loads (the heavy part, not only the package).
MODULES = {"torch": "torch", "vllm": "vllm", "ray": "ray", "transformer-engine": "transformer_engine.pytorch",
           "numpy": "numpy", "triton": "triton"}
# Sources -> module (their directory is on the image's PYTHONPATH).
SOURCE_MODULES = {"megatron-lm": "megatron.core", "rl-kernel": "rl_kernel", "vime": "vime"}
# The kit's strict operators (CPU reference and the primitives they use); the Triton twins import too.
KIT_MODULES = ("rlk_kernels.primitives", "rlk_kernels.ops", "rlk_kernels.conformance")
NEEDS_GPU = ("CUDA kernels (torch.cuda, Transformer Engine's fused kernels, the kit's Triton twins)",
             "NCCL collectives", "cuDNN", "vLLM's engine start and CUDA graphs", "the driver/runtime pairing "
             "(CUDA 12.8 user space against the host driver)")

# Runs in the image: each import timed, a failure kept as one line; JSON on stdout.
_SCRIPT = """
import importlib, json, sys, time, traceback
out = []
for name in sys.argv[1:]:
    t = time.monotonic()
    try:
        importlib.import_module(name)
        out.append({"module": name, "ok": True, "seconds": round(time.monotonic() - t, 3)})
    except BaseException as exc:
        line = (str(exc).splitlines() or [""])[0][:300]
        out.append({"module": name, "ok": False, "seconds": round(time.monotonic() - t, 3),
                    "error": type(exc).__name__ + ": " + line})
print(json.dumps(out))
"""


def import_targets(stack_doc: dict, platform: str) -> list[str]:
    """The modules to import in an image of this stack: its frameworks, its sources, the kit's kernels."""
    packages = packages_for(stack_doc, platform)
    out = [module for name, module in MODULES.items() if name in packages]
    out += [SOURCE_MODULES[s["name"]] for s in stack_doc.get("sources", []) if s["name"] in SOURCE_MODULES]
    return out + (list(KIT_MODULES) if "torch" in packages else [])   # the kernels are torch code


def run_import_checks(client, image: str, modules: list[str], *, timeout_s: int = 600) -> list[dict]:
    """``[{"module", "ok", "seconds", "error"?}]`` from a throwaway container of ``image`` (no network)."""
    container = client.containers.create(image, command=["python", "-c", _SCRIPT, *modules],
                                         entrypoint=["/opt/rlk/bin/entrypoint"], network_mode="none")
    try:
        container.start()
        status = container.wait(timeout=timeout_s)
        out = container.logs(stdout=True, stderr=False).decode(errors="replace").strip().splitlines()
        if status.get("StatusCode") != 0 or not out:
            err = container.logs(stdout=False, stderr=True).decode(errors="replace").strip()[-400:]
            raise CheckFailed(f"import checks in {image} exited {status.get('StatusCode')}: {err}")
    finally:
        container.remove(force=True)
    return json.loads(out[-1])
