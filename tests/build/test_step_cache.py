"""The engine's own image of a build: kept once per stack and platform as the next build's step cache,
and never the image a run, doctor or suite picks (it carries the build's labels too). The leaves of a
multi-stage build's earlier stages are kept the same way, so cold builds do not pile up copies."""

from __future__ import annotations

import hashlib
import io
import time
import uuid
from pathlib import Path

import pytest

from kit.adapters import docker as dockerdoor
from kit.build.images import build_image
from kit.build.layout import step_cache_ref
from kit.build.lookup import find_stack_image, stack_image
from kit.build.plan import BuildPlan, ContextEntry

pytestmark = pytest.mark.docker


def scratch_image(client, labels: dict[str, str], tag: str | None = None, n: int = 0):
    dockerfile = "FROM scratch\nLABEL " + " ".join(f"{k}={v}" for k, v in labels.items()) + f" n={n}\n"
    image, _ = client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True)
    return image


def test_retag_keeps_one_step_cache_image_and_lookup_never_picks_it(docker_engine):
    stack = f"step-cache-{uuid.uuid4().hex[:8]}"
    sha = uuid.uuid4().hex * 2
    labels = {"dev.rlk-kit.stack.sha256": sha, "dev.rlk-kit.platform": "cpu", "dev.rlk-kit.stack.name": stack}
    cache_ref = f"rlk-kit/{stack}:cpu-step-cache"
    made = []
    try:
        kit_image = scratch_image(docker_engine, labels, f"rlk-kit/{stack}:cpu-0123456789ab", 0)
        made.append(kit_image.id)
        time.sleep(1.1)                       # the engine's images of later builds are newer
        first_engine = scratch_image(docker_engine, labels, None, 1)
        made.append(first_engine.id)
        dockerdoor.retag(docker_engine, first_engine.id, cache_ref)
        assert dockerdoor.find_image(docker_engine, cache_ref).id == first_engine.id

        second_engine = scratch_image(docker_engine, labels, None, 2)   # untagged, like a build's leftover
        made.append(second_engine.id)
        # newest by creation, labelled alike: neither the untagged nor the step-cache image is chosen
        assert stack_image(docker_engine, sha, "cpu").id == kit_image.id
        assert find_stack_image(stack, sha, "cpu", docker_engine).id == kit_image.id

        dockerdoor.retag(docker_engine, second_engine.id, cache_ref)
        assert dockerdoor.find_image(docker_engine, cache_ref).id == second_engine.id
        assert dockerdoor.find_image(docker_engine, first_engine.id) is None    # one cache image, not two
    finally:
        for image_id in made:
            try:
                docker_engine.images.remove(image_id, force=True)
            except Exception:
                pass


STAGED = b"""FROM rlk-kit/debian-base:bookworm AS first
RUN head -c 4096 /dev/urandom > /first
FROM rlk-kit/debian-base:bookworm
COPY --from=first /first /first
"""


def test_cold_builds_replace_their_stage_caches_instead_of_leaving_them(docker_engine, tmp_path: Path):
    stack = f"stage-cache-{uuid.uuid4().hex[:8]}"
    tag = f"rlk-kit/{stack}:cpu-0123456789ab"
    digest = "sha256:" + hashlib.sha256(STAGED).hexdigest()
    plan = BuildPlan(platform="cpu", stack_name=stack, stack_sha256="0" * 64, dockerfile="Dockerfile", build_args={},
                     labels={}, context=(ContextEntry("Dockerfile", 0o644, digest, data=STAGED),), inputs_sha256="1" * 64,
                     tag=tag, base_image="rlk-kit/debian-base:bookworm", base_unresolved=False)
    stage_ref = step_cache_ref(tag, "cpu", "first")
    assert stage_ref == f"rlk-kit/{stack}:cpu-first-step-cache"
    leaves, finals = [], []
    try:
        for _ in range(2):   # cold each time: the engine makes a new image for every step
            finals.append(build_image(plan, workspace=tmp_path, client=docker_engine, nocache=True,
                                      reproducible=False, write_record=False).image_id)
            leaves.append(dockerdoor.find_image(docker_engine, stage_ref).id)
        assert leaves[0] != leaves[1]
        assert dockerdoor.find_image(docker_engine, leaves[0]) is None     # the first build's stage is gone
        dangling = {image.id for image in docker_engine.images.list(filters={"dangling": True})}
        assert leaves[1] not in dangling
    finally:
        for ref in (*finals, stage_ref):
            try:
                docker_engine.images.remove(ref, force=True)
            except Exception:
                pass
