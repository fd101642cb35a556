"""Where things live inside every kit image and container (CUDA, ROCm and CPU alike).

One table, read by the build planner, the probe, the VIME command builder and the Docker runtime.
The Dockerfiles spell the same paths literally (a Dockerfile cannot import Python);
tests/build/test_image_layout.py holds every path they name to this table.
"""

from kit.model import labels

SOURCES_DIR = "/opt/rlk/src"            # each stack source at /opt/rlk/src/<source name>
STACK_PATH = "/opt/rlk/stack.json"      # the resolved stack document baked into the image
LOCK_PATH = "/opt/rlk/lock.json"        # the lock the image's packages were installed from
PROBE_AT_BUILD_PATH = "/opt/rlk/probe-at-build.json"   # the probe's document from the build's last step
VENV = "/opt/rlk/venv"
PYTHON_INSTALL_DIR = "/opt/rlk/python"  # the interpreter uv installs for the CUDA/ROCm venv
BIN_DIR = "/opt/rlk/bin"                # docker/bin/ of the kit: entrypoint, install-source
PYTHON = "/opt/rlk/venv/bin/python"
RAY = "/opt/rlk/venv/bin/ray"
ENTRYPOINT = "/opt/rlk/bin/entrypoint"
WORKSPACE = "/workspace"                # read-write: runs, records
MODEL_DIR = "/inputs/model"             # read-only: Hugging Face checkpoint
CHECKPOINT_DIR = "/inputs/torch_dist"   # read-only: Megatron torch_dist checkpoint
DATA_DIR = "/inputs/data"               # read-only: prompt JSONL

LABEL_PREFIX = labels.LABEL_PREFIX   # kit/model/labels.py: the model reads labels too
# The tag suffix under which the engine's own image of a build is kept as the next build's step cache:
# it carries the build's labels but is not the kit's image (kit.build.lookup never picks it).
STEP_CACHE_SUFFIX = "-step-cache"


def step_cache_ref(tag: str, platform: str, stage: str = "") -> str:
    """``rlk-kit/smoke:cpu-step-cache`` (the engine's image of a build) or, for a named stage of its
    Dockerfile, ``rlk-kit/smoke:cpu-packages-step-cache``: one image per ref, replaced by the next build."""
    return f"{tag.rpartition(':')[0]}:{platform}{'-' + stage if stage else ''}{STEP_CACHE_SUFFIX}"


# How a stack is checked inside a container (a throwaway one or a run's live one): the stack goes in
# through the environment, so the probe reports exactly its packages and sources. Exit 1 (pins
# differ) still prints the probe document, which the caller compares again. The conformance
# fingerprint is computed there too (about a second on the smoke shape), so run manifests carry it.
PROBE_STACK_ENV = "KIT_PROBE_STACK"
PROBE_COMMAND = ["sh", "-c", f'printf "%s" "${PROBE_STACK_ENV}" > /tmp/kit-probe-stack.json && '
                             "exec kit probe --json --check-stack /tmp/kit-probe-stack.json"]


def source_dir(name: str) -> str:
    """``source_dir("vime") == "/opt/rlk/src/vime"``."""
    return f"{SOURCES_DIR}/{name}"
