"""Which local image holds a stack: the look-up that ``kit run``, ``kit doctor``, ``kit suite`` and the
checkpoint conversion share, so the image a check passed is the image a run starts.

Images are found by the labels ``kit build`` sets (stack sha256 and platform); of several, the newest
by creation time (ties: the larger id). Example::

    stack_image(engine(), arm.stack.sha256, "cpu").id     # 'sha256:…'
"""

from __future__ import annotations

from kit.adapters import docker as dockerdoor
from kit.build.layout import LABEL_PREFIX, STEP_CACHE_SUFFIX
from kit.model.errors import BadInput


def stack_image(client, stack_sha256: str, platform: str):
    """The image a run of this stack and platform uses, or None.

    Only tagged images count: the engine's own image of a build carries the same labels, and is either
    untagged or kept under a step-cache tag; the kit's image is always tagged."""
    labelled = dockerdoor.list_images(client, labels={f"{LABEL_PREFIX}.stack.sha256": stack_sha256,
                                                      f"{LABEL_PREFIX}.platform": platform})
    return dockerdoor.newest(image for image in labelled if _kit_tags(image))


def other_input_images(client, stack_name: str, platform: str, keep_id: str | None) -> list[tuple[str, str, int]]:
    """The kit's images of this stack and platform built from other inputs than ``keep_id``'s (earlier
    revisions of the stack or the kit), as (ref, id, bytes only that image holds), by ref. A run never
    picks them; they stay on the engine until removed, with every layer they do not share."""
    found = [image for image in dockerdoor.list_images(client, name=f"rlk-kit/{stack_name}")
             if image.id != keep_id and _tagged_for(image, platform)]
    if not found:
        return []
    sizes = dockerdoor.own_bytes(client)
    return sorted((min(_kit_tags(image)), image.id, sizes.get(image.id, 0)) for image in found)


def _kit_tags(image) -> list[str]:
    return [tag for tag in image.tags if not tag.endswith(STEP_CACHE_SUFFIX)]


def _tagged_for(image, platform: str) -> bool:
    """Has a kit tag of the form ``rlk-kit/<stack>:<platform>-<inputs12>``."""
    return any(tag.split(":", 1)[-1].startswith(f"{platform}-") for tag in _kit_tags(image))


def image_for_arm(client, arm) -> str:
    """The reference of :func:`stack_image` for an arm; BadInput naming the build command when none."""
    image = stack_image(client, arm.stack.sha256, arm.platform)
    if image is None:
        raise BadInput(f"no {arm.platform} image on this engine carries stack {arm.stack.name} "
                       f"({arm.stack.sha256[:12]}); build it with `kit build {arm.platform} --arm {arm.name}` "
                       "or pass --image REF")
    return dockerdoor.ref_of(image)


def find_stack_image(stack_name: str, stack_sha256: str, platform: str, client=None):
    """The image a run of this stack and platform would use, or None.

    First :func:`stack_image` (by labels, the newest), so doctor checks the image the run starts; then,
    only to report it, the newest image of the tag form ``rlk-kit/<stack>:<platform>-<inputs12>``, which
    finds an image of an older revision of the stack for ``check_image`` to name the differences of.
    """
    client = client or dockerdoor.client(dockerdoor.DOCTOR_TIMEOUT_S)
    chosen = stack_image(client, stack_sha256, platform)
    if chosen is not None:
        return chosen
    return dockerdoor.newest(image for image in dockerdoor.list_images(client, name=f"rlk-kit/{stack_name}")
                             if _tagged_for(image, platform))
