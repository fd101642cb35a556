"""What a run needs before it starts, each with its state, in doctor's PASS/FAIL/SKIP form: the image of
the arm's stack (which also carries the pinned sources) and the files a VIME arm reads, with the hashes
the arm pins. ``kit run --dry-run`` lists them all; a real run refuses with every missing one at once.
Example::

    [c.line() for c in readiness(request)]
    # ['FAIL image: no cuda image on this engine carries stack vime-g11 (3a383d6fd959); build it with ...',
    #  'FAIL inputs.model: arm G11 reads model: give --model DIR ...', 'FAIL inputs.checkpoint: ...', ...]
"""

from __future__ import annotations

from typing import TextIO

from kit.adapters import docker as dockerdoor
from kit.build.image_checks import check_image
from kit.build.lookup import image_for_arm
from kit.model.engine_traits import traits
from kit.model.errors import BadInput, KitError
from kit.run.doctor.context import FAIL, PASS, SKIP, Check
from kit.run.inputs import check_pinned_inputs, find_input_files
from kit.run.request import RunRequest

INPUT_NAMES = ("model", "checkpoint", "prompt_data")


def image_check(request: RunRequest) -> Check:
    """Whether the image the run would start is on the engine and carries the arm's stack."""
    arm = request.arm
    if request.runtime == "local":
        return Check("image", SKIP, "runtime local: the job runs on this host's software, no image "
                                    "(--runtime docker runs the stack's image)")
    if request.runtime == "ray" and request.ray_address:
        return Check("image", SKIP, f"runtime ray at {request.ray_address}: each node's image is probed "
                                    "when the run starts")
    try:
        client = dockerdoor.engine(dockerdoor.DOCTOR_TIMEOUT_S)
        ref = request.image or image_for_arm(client, arm)
        result = check_image(ref, arm.stack, client=client)
    except KitError as exc:
        return Check("image", FAIL, str(exc))
    details = {"image": ref, "id": result.image_id}
    if result.matches:
        return Check("image", PASS, f"{ref} carries stack {arm.stack.name} ({arm.stack.sha256[:12]}) and its "
                                    "pinned sources", details)
    shown = "; ".join(f"{label}: expected {exp!r}, found {got!r}" for label, exp, got in result.differences[:5])
    return Check("image", FAIL, f"{ref} is not built for stack {arm.stack.name} ({arm.stack.sha256[:12]}): {shown}",
                 details)


def input_checks(request: RunRequest, progress: TextIO | None = None) -> list[Check]:
    """One check per input file the arm reads (found, or what to give), then the hashes the arm pins."""
    arm = request.arm
    if not traits(arm.engine).uses_input_files:
        return [Check("inputs", SKIP, f"arm {arm.name} uses the {arm.engine} engine's built-in inputs")]
    try:
        found, missing = find_input_files(request)
    except BadInput as exc:     # an unreadable provenance in the workspace
        return [Check("inputs", FAIL, str(exc))]
    checks = [Check(f"inputs.{name}", FAIL, missing[name]) if name in missing else
              Check(f"inputs.{name}", PASS, str(found[name]), {"path": str(found[name])}) for name in INPUT_NAMES]
    pins = sorted(arm.document.get("inputs") or {})
    if not pins:
        checks.append(Check("inputs.pins", SKIP, f"arm {arm.name} pins no input hash: the run records the hashes "
                                                 "it finds"))
    elif missing:
        checks.append(Check("inputs.pins", SKIP, f"{', '.join(pins)}: checked once every input is found"))
    else:
        try:
            check_pinned_inputs(request, found, progress)
            checks.append(Check("inputs.pins", PASS, f"{', '.join(pins)} as arm {arm.name} pins"))
        except KitError as exc:
            checks.append(Check("inputs.pins", FAIL, str(exc)))
    return checks


def readiness(request: RunRequest, progress: TextIO | None = None) -> list[Check]:
    return [image_check(request), *input_checks(request, progress)]


def missing_inputs_message(request: RunRequest, missing: BadInput) -> str:
    """A run's missing inputs, with the missing image first when it is missing too."""
    image = image_check(request)
    return f"{image.reason}\n{missing}" if image.status == FAIL else str(missing)
