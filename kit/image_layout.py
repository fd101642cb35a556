"""Where things live inside every kit image and container (CUDA, ROCm and CPU alike).

One table, read by the Dockerfiles' build args, the probe, the VIME command builder and
the Docker runtime, so no in-image path is written twice.
"""

SOURCES_DIR = "/opt/rlk/src"            # each stack source at /opt/rlk/src/<source name>
STACK_PATH = "/opt/rlk/stack.json"      # the resolved stack document baked into the image
BUILD_INFO_PATH = "/opt/rlk/build.json" # build args and inputs sha256, written at build time
PROBE_AT_BUILD_PATH = "/opt/rlk/probe-at-build.json"   # the probe's document from the build's last step
VENV = "/opt/rlk/venv"
PYTHON = "/opt/rlk/venv/bin/python"
RAY = "/opt/rlk/venv/bin/ray"
ENTRYPOINT = "/opt/rlk/bin/entrypoint"
WORKSPACE = "/workspace"                # read-write: runs, records
MODEL_DIR = "/inputs/model"             # read-only: Hugging Face checkpoint
CHECKPOINT_DIR = "/inputs/torch_dist"   # read-only: Megatron torch_dist checkpoint
DATA_DIR = "/inputs/data"               # read-only: prompt JSONL

LABEL_PREFIX = "dev.rlk-kit"


def source_dir(name: str) -> str:
    """``source_dir("vime") == "/opt/rlk/src/vime"``."""
    return f"{SOURCES_DIR}/{name}"
