"""What differs between accelerator kinds when a container gets its devices: one table, read by the
docker runtime, the Slurm script and the KubeRay documents alike (pure data and pure functions).

CUDA hands GPUs to a container through the NVIDIA runtime (``--gpus``) and narrows them with
``CUDA_VISIBLE_DEVICES``; ROCm needs the device nodes ``/dev/kfd`` and ``/dev/dri`` passed in, the
``video`` and ``render`` groups for access to them, and ``HIP_VISIBLE_DEVICES``. Example::

    docker_run_flags("rocm")[:4]     # ['--device=/dev/kfd', '--device=/dev/dri', '--group-add=video', '--group-add=render']
    ACCELERATORS["cuda"].k8s_resource  # 'nvidia.com/gpu'
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Accelerator:
    kind: str                        # cuda | rocm | cpu (the arm's platform)
    visible_devices_env: str | None  # the variable that narrows the devices a process sees
    docker_gpus: bool                # the NVIDIA container runtime's --gpus / device_requests
    devices: tuple[str, ...]         # device nodes passed through as they are
    groups: tuple[str, ...]          # supplementary groups that own those device nodes
    security_opt: tuple[str, ...]    # ROCm's debugger and HSA need the default seccomp profile off
    ipc_host: bool                   # NCCL/RCCL shared memory between ranks of one node
    k8s_resource: str | None         # the device plugin's extended resource
    apptainer_flag: str | None       # apptainer exec's device flag
    ulimits: tuple[tuple[str, int, int], ...]   # (name, soft, hard): pinned memory for RDMA, deep stacks


ACCELERATORS: dict[str, Accelerator] = {
    "cuda": Accelerator("cuda", "CUDA_VISIBLE_DEVICES", True, (), (), (), True, "nvidia.com/gpu", "--nv",
                        (("memlock", -1, -1), ("stack", 67108864, 67108864))),
    "rocm": Accelerator("rocm", "HIP_VISIBLE_DEVICES", False, ("/dev/kfd", "/dev/dri"), ("video", "render"),
                        ("seccomp=unconfined",), True, "amd.com/gpu", "--rocm", (("memlock", -1, -1),)),
    "cpu": Accelerator("cpu", None, False, (), (), (), False, None, None, ()),
}

SHM_SIZE = "1g"   # Ray's object store and the data loaders need more than Docker's 64 MiB default (node_sizes' cpu shm)


# Ray's object store per GPU of a node: the study's head ran --object-store-memory=200000000000 on 8 GPUs.
OBJECT_STORE_PER_GPU = 25_000_000_000
CPU_OBJECT_STORE = 500_000_000       # the smoke arm's rollouts are kilobytes; half of the 1 GiB shm
SHM_HEADROOM = 8 * 2**30             # NCCL/RCCL buffers and data loaders beside the object store


@dataclass(frozen=True)
class NodeSizes:
    gpus_per_node: int
    object_store_bytes: int          # ray start --object-store-memory
    shm_bytes: int                   # /dev/shm: the object store lives there, so it is at least as large


def node_sizes(kind: str, gpus: int) -> NodeSizes:
    """What one node of an arm gets, from its platform and its topology's GPUs: the one sizing rule the
    Slurm script, the KubeRay documents and the docker runtime share (an arm's GPUs are one node's).

    ``node_sizes("cuda", 8)`` -> NodeSizes(8, 200000000000, 208589934592); cpu: 0 GPUs, 0.5 GB in 1 GiB."""
    accelerator(kind)
    if kind == "cpu" or gpus <= 0:
        return NodeSizes(0, CPU_OBJECT_STORE, 2**30)
    store = OBJECT_STORE_PER_GPU * gpus
    return NodeSizes(gpus, store, store + SHM_HEADROOM)


def accelerator(kind: str) -> Accelerator:
    """The row for ``kind``; ValueError naming the accepted kinds otherwise."""
    try:
        return ACCELERATORS[kind]
    except KeyError:
        raise ValueError(f"accelerator {kind!r}: accepted {', '.join(ACCELERATORS)}") from None


def docker_run_flags(kind: str, gpus: str = "all") -> list[str]:
    """``docker run`` flags for the devices of ``kind`` (``gpus``: ``all`` or a count), shm included."""
    acc = accelerator(kind)
    flags = [f"--device={d}" for d in acc.devices] + [f"--group-add={g}" for g in acc.groups]
    flags += [f"--security-opt={s}" for s in acc.security_opt]
    if acc.docker_gpus:
        flags.append(f"--gpus={gpus}")
    if acc.ipc_host:
        flags.append("--ipc=host")
    else:
        flags.append(f"--shm-size={SHM_SIZE}")
    flags += [f"--ulimit={name}={soft}:{hard}" for name, soft, hard in acc.ulimits]
    return flags


def docker_py_options(kind: str) -> dict:
    """The same as ``docker_run_flags`` in docker-py's ``containers.run`` keywords, as plain data
    (``device_requests``/``ulimits`` as dicts the adapter turns into docker.types)."""
    acc = accelerator(kind)
    opts: dict = {"privileged": False}
    if acc.devices:
        opts["devices"] = [f"{d}:{d}:rwm" for d in acc.devices]
    if acc.groups:
        opts["group_add"] = list(acc.groups)
    if acc.security_opt:
        opts["security_opt"] = list(acc.security_opt)
    if acc.docker_gpus:
        opts["device_requests"] = [{"count": -1, "capabilities": [["gpu"]]}]
    if acc.ipc_host:
        opts["ipc_mode"] = "host"
    else:
        opts["shm_size"] = SHM_SIZE
    if acc.ulimits:
        opts["ulimits"] = [{"name": name, "soft": soft, "hard": hard} for name, soft, hard in acc.ulimits]
    return opts


def visible_devices(kind: str, indices: list[int]) -> dict[str, str]:
    """The environment that narrows a process to ``indices`` (empty for cpu)."""
    acc = accelerator(kind)
    return {acc.visible_devices_env: ",".join(str(i) for i in indices)} if acc.visible_devices_env else {}


def k8s_container_fields(kind: str, gpus_per_pod: int) -> dict:
    """Fields of a Kubernetes container for ``kind``: the device plugin's resource (on Kubernetes the
    plugin, not the pod, mounts /dev/kfd and /dev/dri and sets their permissions)."""
    acc = accelerator(kind)
    out: dict = {}
    if acc.k8s_resource and gpus_per_pod > 0:
        out["resources"] = {"limits": {acc.k8s_resource: str(gpus_per_pod)},
                            "requests": {acc.k8s_resource: str(gpus_per_pod)}}
    return out
