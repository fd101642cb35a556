"""P+: the fair production baseline of a Qwen3 decoder layer on one CUDA GPU (not strict).

The kernels live in the package (:mod:`rlk_kernels.gpu.production`, ``kernels/gpu/production.py``),
where the GRPO workload's fused production uses them too; this module re-exports them under the
names the kernel benchmark (``gpu_strict_kernels.py``) imports. ``rlk_kernels`` must be importable
(installed, or registered by the benchmark's ``_bootstrap``).
"""

from __future__ import annotations

from rlk_kernels.gpu.production import (BACKENDS, BackendChoice, fused_add_rms_norm, logp_from_logits,  # noqa: F401
                                        pick_backend, qk_norm_rope, rms_norm, sdpa, silu_and_mul, time_us)
