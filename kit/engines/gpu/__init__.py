"""The gpu engine: the kit's GRPO workload (``rlk_kernels.grpo``) on one CUDA device, run in process.

It prints VIME-format records with the smoke workload's keys, so the gates, ``kit compare`` and
``kit analyze`` read it unchanged; what is its own is the command, the input hashes and the
identity of the accelerator it ran on. Example::

    from kit.engines import gpu
    gpu.command_argv("python3", "/ws/runs/r1")   # [..., "-m", "rlk_kernels.grpo.run", "--arm-file", "/ws/runs/r1/arm.json"]
"""

from kit.engines.gpu.engine import (ENGINE, ENTRY_MODULE, accelerator_identity, command_argv, run_in_process,
                                    workload_inputs)

__all__ = ["ENGINE", "ENTRY_MODULE", "accelerator_identity", "command_argv", "run_in_process", "workload_inputs"]
