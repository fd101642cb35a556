"""The GPU GRPO workload: a Qwen3-8B-shaped policy (fewer layers, seeded init) trained with GRPO on one device.

``config`` reads the arm, ``task`` is the synthetic task and its verifiable reward, ``policy`` the
passes (strict R or production P per module), ``trainer`` the recompute, loss and AdamW step,
``run`` the driver that prints VIME-format records. Runs on CUDA (strict Triton kernels) and, at
small shapes, on the CPU (the strict reference). Example::

    python -m rlk_kernels.grpo.run --arm-file manifests/gpu-consistency.json --rollouts 2
"""
