"""A prompt's attention on tensor cores (shaders/attention_coopmat.comp, chosen by
lowering/attention.coopmat_config under torch's "high" and "medium" matmul precision).

Against eager in fp64, within 4x of the error of the same attention with its products'
operands rounded to TF32 (q, k, then the weights p and v: what torch's TF32 matmuls round),
and each element within 2^-7 of its magnitude (_reference): causal prompts
at the start and at the end of a longer cache, rows past a block, keys past a chunk, GQA,
head dims that differ, soft-capping, a mask with holes and a row with no live key (NaN
where eager has it), strided q, K and V (scalar loads), and inputs far outside fp16's range
(the scaling). Runs where the device has fp16 cooperative matrices with fp32 sums
(lavapipe's cooperative-matrix build: 8x8x8, subgroups of 8; the H100: 16x16x16 and
subgroups of 32, where each row's softmax is spread over two lanes) and skips elsewhere,
saying so; under "highest" the fp32 kernels run on every device.
"""
import math

import pytest
import torch

from dynamo_vulkan import device, shaders
from dynamo_vulkan.fused import attention
from dynamo_vulkan.lowering import attention as att
from dynamo_vulkan.runtime.shaders import compile_source, kernel_source
from test_coopmat import _tensor_cores_on, plan_apart, precision, require_coopmat, tf32  # noqa: F401
from vk import compiled


def _causal(t, c, start):
    return (start + torch.arange(t))[:, None] >= torch.arange(c)[None, :]


def _reference(q, k, v, mask, scale, softcap=0.0, rounded=False):
    """fp64 attention, written apart from the op (rounded: q, k, p and v as TF32), and
    each element's magnitude: sum_j p_j |v_j| (1 + |q| . |k_j| scale), the first-order
    bound of what rounding v, p and the scores' operands moves it by, in units of their
    rounding."""
    r = tf32 if rounded else (lambda x: x)
    g = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(g, 0), v.repeat_interleave(g, 0)
    s = (r(q).double() @ r(k).double().transpose(1, 2)) * scale
    if softcap:
        s = torch.tanh(s / softcap) * softcap
    p = torch.softmax(s.masked_fill(~mask, float("-inf")), -1)
    reach = (q.double().abs() @ k.double().abs().transpose(1, 2)) * abs(scale)
    return r(p.float()).double() @ r(v).double(), (p * (1 + reach)) @ v.double().abs()


def assert_attention_near(got, q, k, v, mask, scale, softcap=0.0):
    want, mag = _reference(q, k, v, mask, scale, softcap)
    tf, _ = _reference(q, k, v, mask, scale, softcap, rounded=True)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan), "NaN where eager has none, or none where it has"
    got, want, tf, mag = (x.double()[~nan] for x in (got, want, tf, mag))
    base = (tf - want).norm() / max(want.norm(), 1e-300)
    err = (got - want).norm() / max(want.norm(), 1e-300)
    assert err <= 4 * max(base, 2 ** -12), f"relative error {err:.3g} against TF32's {base:.3g}"
    worst = ((got - want).abs() - 2 ** -7 * mag).max().item()
    assert worst <= 0, f"an element off by {worst:.3g} more than 2^-7 of its magnitude"


@pytest.fixture
def on_tensor_cores(monkeypatch, precision):
    """fp16 cooperative matrices required; the kernel allowed on this CPU device, its plans
    cached apart; precision "high"."""
    require_coopmat("f16", monkeypatch)
    monkeypatch.setattr(att, "COOPMAT_ON_CPU", True)
    plan_apart(monkeypatch, "attention on tensor cores")
    precision("high")


def _notes(plans):
    return [d.note for p in plans for d in p.dispatches if d.name.startswith("attention")]


# (query heads, kv heads, rows, keys, head dim, value dim, where the prompt starts)
CASES = [(4, 2, 37, 37, 64, 64, 0), (3, 1, 16, 50, 32, 48, 34), (2, 2, 70, 130, 128, 128, 0),
         (8, 2, 33, 300, 64, 64, 200), (4, 1, 20, 20, 256, 256, 0)]


@pytest.mark.parametrize("hq,hkv,t,c,d,dv,start", CASES, ids=str)
def test_prompt_attention(on_tensor_cores, plans, hq, hkv, t, c, d, dv, start):
    g = torch.Generator().manual_seed(t + c + d)
    q, k, v = torch.randn(hq, t, d, generator=g), torch.randn(hkv, c, d, generator=g), \
        torch.randn(hkv, c, dv, generator=g)
    mask, scale = _causal(t, c, start), 1 / math.sqrt(d)
    got = compiled(lambda q, k, v, m: attention(q, k, v, m, scale))(q, k, v, mask)
    assert_attention_near(got, q, k, v, mask, scale)
    notes = _notes(plans)
    assert notes and "tensor cores fp16 scaled" in notes[-1], notes


@pytest.mark.parametrize("softcap", [0.0, 2.5])
def test_holes_softcap_and_a_row_with_no_live_key(on_tensor_cores, plans, softcap):
    hq, hkv, t, c, d = 4, 2, 40, 90, 64
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(*s, generator=g) for s in ((hq, t, d), (hkv, c, d), (hkv, c, d)))
    mask = (torch.rand(t, c, generator=g) > 0.3) & _causal(t, c, c - t)
    mask[1, :] = False
    got = compiled(lambda q, k, v, m: attention(q, k, v, m, 0.2, softcap))(q, k, v, mask)
    assert torch.isnan(got[:, 1]).all()
    assert_attention_near(got, q, k, v, mask, 0.2, softcap)


def test_strided_operands(on_tensor_cores, plans):
    """q a view of [t, heads, d] (vec4 rows), K transposed and V cut (scalar loads)."""
    hq, hkv, t, c, d = 6, 2, 45, 100, 32
    g = torch.Generator().manual_seed(5)
    q = torch.randn(t, hq, d, generator=g).transpose(0, 1)
    k = torch.randn(hkv, d, c, generator=g).transpose(1, 2)
    v = torch.randn(hkv, c, d + 8, generator=g)[..., :d]
    mask = _causal(t, c, c - t)
    got = compiled(lambda q, k, v, m: attention(q, k, v, m, 0.3))(q, k, v, mask)
    assert_attention_near(got, q, k, v, mask, 0.3)
    assert "tensor cores" in _notes(plans)[-1]


def test_inputs_beyond_fp16s_range(on_tensor_cores):
    """q and K far past fp16's largest value and far below its smallest normal one, V past
    it in a late chunk (the output's accumulators scaled down) and tiny in another: each
    row's and chunk's power of two keeps them in range."""
    hq, hkv, t, c, d = 2, 1, 24, 120, 64
    g = torch.Generator().manual_seed(7)
    q = torch.randn(hq, t, d, generator=g) * 1e-3
    q[:, ::2] *= 1e9
    k = torch.randn(hkv, c, d, generator=g) * 1e-2
    k[:, 5::3] *= 1e-4
    v = torch.randn(hkv, c, d, generator=g)
    v[:, 80:] *= 1e7
    v[:, 10:20] *= 1e-6
    mask = _causal(t, c, c - t)
    scale = 1e-3 / math.sqrt(d)
    got = compiled(lambda q, k, v, m: attention(q, k, v, m, scale))(q, k, v, mask)
    assert torch.isfinite(got).all()
    assert_attention_near(got, q, k, v, mask, scale)


def test_highest_keeps_fp32_kernels(monkeypatch, precision, plans):
    """Under "highest" (the default) no prompt's attention runs on tensor cores."""
    monkeypatch.setattr(att, "COOPMAT_ON_CPU", True)
    monkeypatch.setenv("DYNAMO_VULKAN_CPU_MATMUL", "vulkan")
    plan_apart(monkeypatch, "attention on tensor cores")
    precision("highest")
    q, k, v = torch.randn(2, 20, 16), torch.randn(2, 20, 16), torch.randn(2, 20, 16)
    mask = _causal(20, 20, 0)
    torch.testing.assert_close(compiled(lambda q, k, v, m: attention(q, k, v, m, 0.25))(q, k, v, mask),
                               _reference(q, k, v, mask, 0.25)[0].float(), rtol=1e-5, atol=1e-5)
    assert not any("tensor cores" in n for n in _notes(plans))


def test_config_fits_shared_memory():
    """The shape chosen keeps within the device's shared memory and favours enough
    workgroups: a 7B's 28 heads keep two subgroups a block, Gemma 3's 4 heads of 256 one."""
    caps = {"cooperative_matrix": True, "subgroup_size": 32, "max_compute_shared_memory_size": 49152,
            "max_compute_work_group_invocations": 1024,
            "cooperative_matrix_shapes": (tuple(sorted({"m": 16, "n": 16, "k": 16, "a": "f16", "b": "f16",
                                                        "c": "f32", "result": "f32",
                                                        "scope": "subgroup"}.items())),)}
    ctx = type("Ctx", (), {"caps": caps, "cfg": type("Cfg", (), {"matmul_precision": "high",
                                                                  "tensor_cores": "auto"})()})()
    if shaders.coopmat_glslc() is None:
        pytest.skip("no glslc for cooperative-matrix kernels here (scripts/glslc_coopmat.sh installs one)")
    seven = att.coopmat_config(ctx, 28, 512, 128, 128)
    gemma = att.coopmat_config(ctx, 4, 512, 256, 256)
    assert (seven.nsg, seven.bkc) == (2, 32) and (gemma.nsg, gemma.bkc) == (1, 32)
    for cfg, d in ((seven, 128), (gemma, 256)):
        assert att._coopmat_shared(cfg.nsg, cfg.bkc, d, d, cfg.cm) <= 49152
    ctx.cfg.matmul_precision = "highest"
    assert att.coopmat_config(ctx, 28, 512, 128, 128) is None


@pytest.mark.parametrize("cm,subgroup,d", [((16, 16, 16), 32, 128), ((16, 16, 16), 32, 256),
                                           ((8, 8, 8), 8, 64)], ids=str)
def test_kernel_compiles_with_the_second_glslc(cm, subgroup, d):
    if shaders.coopmat_glslc() is None:
        pytest.skip("no glslc for cooperative-matrix kernels here (scripts/glslc_coopmat.sh installs one)")
    cfg = att.CoopmatConfig(2, 32, cm, subgroup)
    for extra in ({}, {"Q_VEC4": 1, "K_VEC4": 1, "V_VEC4": 1}):
        _, src = kernel_source("attention_coopmat", cfg.defines() | {"D": d, "DV": d} | extra)
        assert compile_source(src, "attention_coopmat")[:4] == b"\x03\x02\x23\x07"
