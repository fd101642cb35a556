"""The production kernels (rlk_kernels.gpu.production, the fair baseline P+ of the kernel benchmark and the
GRPO workload's fused production), interpreted on the CPU, against plain PyTorch: a baseline that computed
something else would make every ratio meaningless."""

import importlib.util
import os
import pathlib

import pytest
import torch
import torch.nn.functional as F

os.environ["TRITON_INTERPRET"] = "1"          # before triton is imported by the module

from rlk_kernels.gpu import production as fb  # noqa: E402

_PATH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "fair_baseline.py"

BF16_ULP = 2 ** -7                            # relative spacing of bf16


def _norm(x, w, eps=1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(torch.bfloat16)


def _close(a, b, scale=1.0):
    torch.testing.assert_close(a.float(), b.float(), atol=2 * BF16_ULP * scale, rtol=2 * BF16_ULP)


def test_rms_norm_and_fused_residual_add():
    gen = torch.Generator().manual_seed(0)
    x, r = (torch.randn(21, 96, generator=gen).bfloat16() for _ in range(2))
    w = torch.randn(96, generator=gen).bfloat16()
    _close(fb.rms_norm(x, w, 1e-6), _norm(x, w), 4)
    normed, summed = fb.fused_add_rms_norm(x, r, w, 1e-6)
    _close(summed, x + r, 4)
    _close(normed, _norm(x + r, w), 4)


def test_silu_and_mul():
    gu = torch.randn(3, 5, 2 * 40, generator=torch.Generator().manual_seed(1)).bfloat16()
    ref = F.silu(gu[..., :40].float()) * gu[..., 40:].float()
    _close(fb.silu_and_mul(gu), ref, 4)


@pytest.mark.parametrize("b,t,cap", [(1, 6, 6), (3, 1, 9)])        # prefill, decode into a cache
def test_qk_norm_rope_writes_q_and_the_cache(b, t, cap):
    gen = torch.Generator().manual_seed(2)
    hq, hkv, d = 4, 2, 16
    qkv = torch.randn(b * t, (hq + 2 * hkv) * d, generator=gen).bfloat16()
    qw, kw = torch.randn(d, generator=gen).bfloat16(), torch.randn(d, generator=gen).bfloat16()
    cos, sin = torch.randn(16, d // 2, generator=gen).bfloat16(), torch.randn(16, d // 2, generator=gen).bfloat16()
    pos = torch.arange(cap - t, cap).view(1, -1).expand(b, -1)
    kc, vc = torch.zeros(b, hkv, cap, d).bfloat16(), torch.zeros(b, hkv, cap, d).bfloat16()
    q = fb.qk_norm_rope(qkv, b, t, hq, hkv, d, qw, kw, cos, sin, pos, kc, vc, 1e-6)

    def rope(x):
        c, s = cos[pos].float().unsqueeze(1), sin[pos].float().unsqueeze(1)
        x = x.float()
        return torch.cat([x[..., :d // 2] * c - x[..., d // 2:] * s, x[..., d // 2:] * c + x[..., :d // 2] * s], -1)

    split = qkv.view(b, t, hq + 2 * hkv, d)
    assert q.shape == (b, hq, t, d)
    _close(q, rope(_norm(split[:, :, :hq], qw).transpose(1, 2)), 16)
    _close(kc[:, :, cap - t:], rope(_norm(split[:, :, hq:hq + hkv], kw).transpose(1, 2)), 16)
    assert torch.equal(vc[:, :, cap - t:], split[:, :, hq + hkv:].transpose(1, 2))
    assert not kc[:, :, :cap - t].any()                             # earlier cache rows untouched


def test_logp_from_logits_ignores_the_padded_vocabulary():
    gen = torch.Generator().manual_seed(3)
    logits = (torch.randn(5, 5000, generator=gen) * 4).bfloat16()
    targets = torch.randint(0, 4900, (5,), generator=gen)
    ref = logits[:, :4900].float().log_softmax(-1).gather(-1, targets[:, None])[:, 0]
    torch.testing.assert_close(fb.logp_from_logits(logits, targets, 4900), ref, atol=1e-4, rtol=1e-5)


def test_logp_from_logits_divides_by_the_temperature():
    gen = torch.Generator().manual_seed(4)
    logits = (torch.randn(4, 300, generator=gen) * 4).bfloat16()
    targets = torch.randint(0, 16, (4,), generator=gen)
    ref = (logits[:, :16].float() / 0.7).log_softmax(-1).gather(-1, targets[:, None])[:, 0]
    torch.testing.assert_close(fb.logp_from_logits(logits, targets, 16, 0.7), ref, atol=1e-4, rtol=1e-5)


def test_the_benchmark_module_re_exports_the_package_kernels():
    spec = importlib.util.spec_from_file_location("fair_baseline", _PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name in ("rms_norm", "fused_add_rms_norm", "silu_and_mul", "qk_norm_rope", "logp_from_logits", "sdpa",
                 "pick_backend", "BACKENDS"):
        assert getattr(module, name) is getattr(fb, name)
