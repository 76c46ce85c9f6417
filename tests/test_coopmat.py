"""Tensor-core matmuls (lowering/coopmat.py, shaders/matmul_coopmat.comp).

On a device with cooperative matrices: fp32 products under torch's "high" and "medium"
precision (scaled fp16: within 1.5x of TF32's error on the same inputs under "high", 4x
with "medium"'s fp16 partial sums; and bf16x3 / bf16 where a device lacks fp16 matrices,
within the tolerances torch uses for TF32 and bf16) and fp16 tensors' products against eager fp32, on odd shapes, tile edges (M, N past
a tile; K not a multiple of the K step), interior tiles stored directly and through the
scratch, size-1 dimensions, transposed and batched operands, K splits and fused bias and
alpha; the scaled kernels also on inputs of any range (1e±30, rows far apart, infinities
and NaN where eager has them) and unbiased (fp16 rounding to nearest).
Debian 12's lavapipe has none, and those skip, saying so; Debian sid's (Mesa 26.2) has fp16
ones (8x8x8, subgroups of 8): there the fp16 tests run, and the bf16 ones with each bf16
value held in fp16 (coopmat.BF16_IN_F16). What runs everywhere: the choice (never under
"highest", never with DYNAMO_VULKAN_TENSOR_CORES=off), the cache key's precision, and the
kernel's GLSL compiling with the second glslc in every load variant.

On the GPU machine (the device kit): these tests, then the TFLOP/s table of fp32 under
"highest", "high", "medium" and fp16 tensors at 4096^3 and 512x3584x18944 beside torch CUDA
(fp32, TF32, bf16, fp16), per tile variant (the matmul suite has the same rows, default
tile only):
  scripts/on_device.sh sh -c "python3 -m pytest -q -p no:cacheprovider $PWD/tests/test_coopmat.py;
    python3 -m dynamo_vulkan.benchmarks.coopmat_sweep"
"""
import types

import pytest
import numpy as np
import torch

from dynamo_vulkan import config, device, shaders
from dynamo_vulkan.lowering import coopmat, schedule
from dynamo_vulkan.runtime.shaders import compile_source, kernel_source
from vk import compiled

torch.manual_seed(0)
# (m, k, n): past one tile by one, exact tiles, size-1 K and N, a K split (few tiles);
# interior tiles stored directly beside an edge tile (N % 4 == 0), K an odd number of
# half K steps; an edge row of tiles under exact columns, K not a multiple of 4
SHAPES = [(17, 1, 1), (33, 7, 9), (128, 128, 128), (129, 130, 131), (255, 33, 257), (64, 2048, 64),
          (256, 80, 260), (300, 101, 384)]
BF16_CAPS = {"cooperative_matrix": True, "bfloat16_cooperative_matrix": True, "subgroup_size": 32,
             "max_compute_shared_memory_size": 49152, "max_compute_work_group_invocations": 1024,
             "device_type": "PHYSICAL_DEVICE_TYPE_DISCRETE_GPU",
             "cooperative_matrix_shapes": tuple(
                 tuple(sorted({"m": 16, "n": 16, "k": 16, "a": t, "b": t, "c": "f32", "result": "f32",
                               "scope": "subgroup", "saturating": False}.items())) for t in ("f16", "bf16"))}


SCALED_CAPS = dict(BF16_CAPS, cooperative_matrix_shapes=BF16_CAPS["cooperative_matrix_shapes"] + (
    tuple(sorted({"m": 16, "n": 16, "k": 16, "a": "f16", "b": "f16", "c": "f16", "result": "f16",
                  "scope": "subgroup", "saturating": False}.items())),))


@pytest.fixture(autouse=True)
def _tensor_cores_on(monkeypatch):
    """Tensor cores on (DYNAMO_VULKAN_TENSOR_CORES=auto, the default) whatever the caller's
    environment says."""
    monkeypatch.setenv("DYNAMO_VULKAN_TENSOR_CORES", "auto")


@pytest.fixture
def precision():
    """Set torch's float32 matmul precision for the test (Dynamo's caches reset around it)."""
    before = torch.get_float32_matmul_precision()

    def set_(value):
        torch._dynamo.reset()
        torch.set_float32_matmul_precision(value)
    yield set_
    torch.set_float32_matmul_precision(before)
    torch._dynamo.reset()


def require_coopmat(dtype="bf16", monkeypatch=None, emulate=True):
    """Skip unless the device multiplies `dtype` on cooperative matrices; on a CPU device
    (lavapipe) keep the products on Vulkan (monkeypatch given). Where only fp16 ones exist
    (a newer lavapipe), bf16 kernels run with their values held in fp16
    (coopmat.BF16_IN_F16) unless `emulate` is off: the inputs must then stay in fp16's
    range."""
    import kp
    if not hasattr(kp, "enabled_features"):
        pytest.fail("kp was built without scripts/patch_kp.py's patch 10: run scripts/setup.sh")
    info = device.device_info()
    if not info.get("cooperative_matrix"):
        pytest.skip("the Vulkan device has no cooperative matrices (VK_KHR_cooperative_matrix)")
    has_f16 = any(dict(s).get("a") == "f16" and dict(s).get("c") == "f32"
                  for s in info.get("cooperative_matrix_shapes", ()))
    if dtype == "bf16" and not info.get("bfloat16_cooperative_matrix"):
        if not (emulate and monkeypatch is not None and has_f16):
            pytest.skip("the Vulkan device has cooperative matrices but no bf16 ones (VK_KHR_shader_bfloat16)")
        monkeypatch.setattr(coopmat, "BF16_IN_F16", True)
        plan_apart(monkeypatch, "bf16 in fp16")
    if shaders.coopmat_glslc() is None:
        pytest.fail("no glslc for cooperative-matrix kernels: scripts/glslc_coopmat.sh install "
                    ".venv/opt/glslc-coopmat, or set DYNAMO_VULKAN_GLSLC_COOPMAT")
    if dtype == "f16" and not has_f16:
        pytest.skip("the Vulkan device has no fp16 x fp16 + fp32 cooperative matrices")
    if dtype == "scaled" and not has_f16:
        pytest.skip("the Vulkan device has no fp16 x fp16 + fp32 cooperative matrices (scaled fp16)")
    if monkeypatch is not None:
        monkeypatch.setenv("DYNAMO_VULKAN_CPU_MATMUL", "vulkan")


def plan_apart(monkeypatch, label: str) -> None:
    """A knob of coopmat's that the plan cache does not know (BF16_IN_F16, FORCE_SPLITS,
    TILE) is set: the device's name keeps these plans cached apart from the default's."""
    info = device.device_info()
    monkeypatch.setitem(info, "name", f"{info['name']} [{label}]")


def coopmat_notes(plans) -> list[str]:
    return [d.note for p in plans for d in p.dispatches if d.name.startswith("matmul_coopmat")]


# tolerances: relative Frobenius error of the whole product (a wrong element anywhere
# shows), and elementwise bounds scaled by sqrt(K) as torch's TF32 / bf16 tests scale them
REL = {"high": 3e-5, "medium": 1.2e-2}
ELEM = {"high": 1e-3, "medium": 1.6e-2}


def assert_near(got, want, k, prec):
    err = (got.double() - want.double()).norm() / max(want.double().norm(), 1e-30)
    assert err <= REL[prec], f"relative error {err:.3g} > {REL[prec]} ({prec})"
    torch.testing.assert_close(got, want, rtol=ELEM[prec], atol=ELEM[prec] * max(k, 1) ** 0.5)


def tf32(x: torch.Tensor) -> torch.Tensor:
    """x rounded to TF32 (10 mantissa bits, to nearest even), as an fp32 tensor."""
    b = x.contiguous().view(torch.int32)
    return ((b + 0xfff + ((b >> 13) & 1)) & ~0x1fff).view(torch.float32)


def assert_scaled_near(got, fn, a, b):
    """Scaled fp16 under the current precision: normwise within 1.5x of TF32's error on the
    same inputs under "high" (fp32 sums: the operands' rounding, which fp16 shares with
    TF32, is the only error), 4x under "medium" (fp16 partial sums of
    coopmat.FOLD_PRODUCTS products: 1.8x TF32's in all on an H200, whose multiply-adds
    round once per instruction, 2.9x on lavapipe, which rounds after every product;
    docs/journal.md, session 33); against fp64, and at least 2^-12, fp16's unit roundoff,
    where TF32 would round an operand exactly (fp16 weights). Each element within 2^-7 of
    its products' magnitudes (fn on |a|, |b|)."""
    factor = 4 if torch.get_float32_matmul_precision() == "medium" else 1.5
    want = fn(a.double(), b.double())
    base = (fn(tf32(a).double(), tf32(b).double()) - want).norm() / max(want.norm(), 1e-300)
    err = (got.double() - want).norm() / max(want.norm(), 1e-300)
    assert err <= factor * max(base, 2 ** -12), f"relative error {err:.3g} against TF32's {base:.3g}"
    bound = 2 ** -7 * fn(a.double().abs(), b.double().abs())
    worst = ((got.double() - want).abs() - bound).max().item()
    assert worst <= 0, f"an element off by {worst:.3g} more than 2^-7 of its products' magnitudes"


# ------------------------------------------------------------------ on tensor cores
MM = lambda x, y: x @ y


@pytest.mark.parametrize("prec", ["high", "medium"])
@pytest.mark.parametrize("m,k,n", SHAPES, ids=str)
def test_mm(precision, plans, monkeypatch, prec, m, k, n):
    require_coopmat("scaled", monkeypatch)
    precision(prec)
    a, b = torch.randn(m, k), torch.randn(k, n)
    assert_scaled_near(compiled(MM)(a, b), MM, a, b)
    notes = coopmat_notes(plans)
    assert notes and all("f16 scaled" in s for s in notes), notes


@pytest.mark.parametrize("prec", ["high", "medium"])
@pytest.mark.parametrize("m,k,n", [(33, 7, 9), (129, 130, 131), (300, 101, 384)], ids=str)
def test_mm_bf16(precision, plans, monkeypatch, prec, m, k, n):
    """Where a device has no fp16 matrices (SCALED_FOR emptied here): bf16x3 ("high")
    and bf16 ("medium") within torch's TF32 and bf16 tolerances."""
    monkeypatch.setattr(coopmat, "SCALED_FOR", {})
    plan_apart(monkeypatch, "unscaled")
    require_coopmat("bf16", monkeypatch)
    precision(prec)
    a, b = torch.randn(m, k), torch.randn(k, n)
    assert_near(compiled(MM)(a, b), a @ b, k, prec)
    notes = coopmat_notes(plans)
    assert notes and all(("bf16x3" if prec == "high" else "bf16 ") in s for s in notes), notes


@pytest.mark.parametrize("prec", ["high", "medium"])
def test_transposed_batched_bias(precision, plans, monkeypatch, prec):
    """A^T and B^T read through their strides (the packs' two thread orders), a batch,
    baddbmm's alpha, beta and broadcast bias fused, nn.Linear's x @ W^T + b."""
    require_coopmat("scaled", monkeypatch)
    precision(prec)
    a, b = torch.randn(3, 70, 65), torch.randn(3, 41, 70)
    bias = torch.randn(65, 1)

    def fn(x, y, c):
        return torch.baddbmm(c, x.transpose(1, 2), y.transpose(1, 2), beta=0.5, alpha=2.0)
    got = compiled(fn)(a, b, bias)
    product = lambda x, y: 2.0 * torch.bmm(x.transpose(1, 2), y.transpose(1, 2))
    assert_scaled_near(got - 0.5 * bias, product, a, b)
    x, w, wb = torch.randn(2, 37, 96), torch.randn(200, 96), torch.randn(200)
    lin = lambda x, w, wb: torch.nn.functional.linear(x, w, wb)
    assert_scaled_near(compiled(lin)(x, w, wb) - wb, lambda x, w: x @ w.transpose(-1, -2), x, w)
    assert len(coopmat_notes(plans)) >= 2


def test_scaled_inputs_of_any_range(precision, plans, monkeypatch):
    """Each row of A and column of B is scaled apart: 1e20-sized and 1e-20-sized rows in
    one operand, columns 1e30 apart in the other, values past fp16's range and below its
    subnormals, all accurate; infinities and NaN give non-finite results where eager's are."""
    require_coopmat("scaled", monkeypatch)
    precision("high")
    g = torch.Generator().manual_seed(1)
    rows = torch.tensor([1e20, 1e-20, 1.0, 7e4, 3e-8] * 26)[:130, None]
    cols = torch.tensor([1e-15, 1e15, 1.0, 1e-5] * 25)[None, :96]
    a, b = torch.randn(130, 70, generator=g) * rows, torch.randn(70, 96, generator=g) * cols
    got = compiled(MM)(a, b)
    want = a.double() @ b.double()
    per_element = (got.double() - want).abs() / (a.double().abs() @ b.double().abs())
    assert torch.isfinite(got).all() and per_element.max() <= 2 ** -7, per_element.max()
    a[3, 5], a[7, 0], b[2, 9] = float("inf"), float("nan"), float("-inf")
    got, want = compiled(MM)(a, b), a @ b
    assert torch.equal(torch.isfinite(got), torch.isfinite(want))
    finite = torch.isfinite(want)
    assert (((got - want).abs() <= 2 ** -7 * (a.abs() @ b.abs()).nan_to_num(posinf=0)) | ~finite).all()


def test_scaled_rounding_is_unbiased(precision, monkeypatch):
    """Positive operands (no cancellation): fp16 rounding to nearest leaves the products'
    sum unbiased, where truncation would make every result low by about 2^-11."""
    require_coopmat("scaled", monkeypatch)
    precision("medium")
    g = torch.Generator().manual_seed(2)
    a, b = torch.rand(256, 512, generator=g) + 0.1, torch.rand(512, 128, generator=g) + 0.1
    got, want = compiled(MM)(a, b).double(), a.double() @ b.double()
    bias = ((got - want) / want).mean().item()
    assert abs(bias) < 1e-4, f"mean relative error {bias:.3g}: biased rounding"


def assert_half_near(got, want, mag):
    """fp16 results of scaled fp16 products (fp16 sums over 32, fp32 beyond): each within
    2^-7 of its products' magnitudes (mag: the product of the operands' magnitudes), and
    the result's own fp16 rounding, of eager's fp32 sums (want)."""
    assert got.dtype == torch.float16
    excess = (got.float() - want.float()).abs() - (2 ** -7 * mag.float() + 2 ** -10 * want.float().abs())
    assert excess.max() <= 0, f"an element off by {excess.max():.3g} more than its bound"


@pytest.mark.parametrize("m,k,n", [(17, 9, 33), (129, 130, 131), (256, 80, 260), (300, 101, 384)], ids=str)
def test_fp16_tensors(precision, plans, monkeypatch, m, k, n):
    """fp16 tensors on fp16 tensor cores (scaled) under any precision."""
    require_coopmat("f16", monkeypatch)
    precision("highest")
    a, b = torch.randn(m, k).half(), torch.randn(k, n).half()
    assert_half_near(compiled(MM)(a, b), a.float() @ b.float(), a.float().abs() @ b.float().abs())
    assert any("f16 scaled" in s for s in coopmat_notes(plans))


def test_fp16_transposed_batched_bias_alpha(precision, plans, monkeypatch):
    """fp16: the column-major shared layouts (A^T, B^T through their strides) in a batch;
    nn.Linear's bias and addmm's alpha, beta and bias fused (the scratch epilogue); alpha
    alone on whole interior tiles (the direct stores, scaled)."""
    require_coopmat("f16", monkeypatch)
    precision("highest")
    a, b = torch.randn(2, 70, 140).half(), torch.randn(2, 129, 70).half()
    bt = lambda x, y: torch.bmm(x.transpose(1, 2), y.transpose(1, 2))
    assert_half_near(compiled(bt)(a, b), bt(a.float(), b.float()), bt(a.float().abs(), b.float().abs()))
    x, w, wb = torch.randn(2, 37, 96).half(), torch.randn(200, 96).half(), torch.randn(200).half()
    lin = lambda x, w, wb: torch.nn.functional.linear(x, w, wb)
    assert_half_near(compiled(lin)(x, w, wb), x.float() @ w.float().t() + wb.float(), x.float().abs() @ w.float().abs().t())
    am = lambda c, x, y: torch.addmm(c, x, y, beta=0.5, alpha=2.0)
    assert_half_near(compiled(am)(wb, x[0], w.t()), 0.5 * wb.float() + 2.0 * x[0].float() @ w.float().t(),
                     2.0 * x[0].float().abs() @ w.float().abs().t())
    x, y, c = torch.randn(256, 40).half(), torch.randn(40, 256).half(), torch.randn(256).half()
    scaled = lambda c, x, y: torch.addmm(c, x, y, beta=0.0, alpha=0.25)
    assert_half_near(compiled(scaled)(c, x, y), 0.25 * x.float() @ y.float(), 0.25 * x.float().abs() @ y.float().abs())
    assert len(coopmat_notes(plans)) >= 4, coopmat_notes(plans)


def check_product(precision, monkeypatch, kind, a, b):
    """a @ b compiled against eager: "f16" as fp16 tensors (within one fp16 rounding),
    "high" or "medium" as fp32 under that precision (scaled fp16: assert_scaled_near)."""
    if kind == "f16":
        require_coopmat("f16", monkeypatch)
        precision("highest")
        a, b = a.half(), b.half()
        assert_half_near(compiled(MM)(a, b), a.float() @ b.float(), a.float().abs() @ b.float().abs())
    else:
        require_coopmat("scaled", monkeypatch)
        precision(kind)
        assert_scaled_near(compiled(MM)(a, b), MM, a, b)


@pytest.mark.parametrize("dtype", ["f16", "high"])
def test_k_splits(precision, plans, monkeypatch, dtype):
    """K in slices (each its own K range, partial products summed after), uneven last."""
    monkeypatch.setattr(coopmat, "FORCE_SPLITS", 3)
    plan_apart(monkeypatch, "3 K splits")
    check_product(precision, monkeypatch, dtype, torch.randn(130, 300), torch.randn(300, 96))
    assert any("K in 3 splits" in s for s in coopmat_notes(plans)), coopmat_notes(plans)


def test_k_split_partials_stay_within_their_budget(as_gpu, precision, plans, monkeypatch):
    """On a GPU a product of few tiles splits K for more workgroups (up to 5 here), but its
    partial products stay within core.SPLIT_K_MAX_BYTES (SmolLM2's 512-row prompt held 18
    MiB of them): a budget of two splits' partials gives two."""
    from dynamo_vulkan.lowering import core
    m, k, n = 130, 640, 96
    monkeypatch.setattr(core, "SPLIT_K_MAX_BYTES", 2 * m * n * 4)
    plan_apart(monkeypatch, "split budget")
    check_product(precision, monkeypatch, "high", torch.randn(m, k), torch.randn(k, n))
    notes = coopmat_notes(plans)
    assert notes and all("K in 2 splits" in s for s in notes), notes


def test_a_large_weights_partials_have_the_larger_budget(as_gpu, precision, plans, monkeypatch):
    """A weight of core.SPLIT_K_LARGE_WEIGHT elements or more may hold
    SPLIT_K_LARGE_MAX_BYTES of partials (a 7B's 128-row prompt wants four splits), a
    smaller one SPLIT_K_MAX_BYTES."""
    from dynamo_vulkan.lowering import core
    m, k, n = 130, 640, 96
    monkeypatch.setattr(core, "SPLIT_K_MAX_BYTES", 2 * m * n * 4)
    monkeypatch.setattr(core, "SPLIT_K_LARGE_MAX_BYTES", 3 * m * n * 4)
    monkeypatch.setattr(core, "SPLIT_K_LARGE_WEIGHT", k * n)
    assert core.split_k_max_bytes(k, n) == 3 * m * n * 4
    assert core.split_k_max_bytes(k, n - 1) == core.split_k_max_bytes(k - 1, n) == 2 * m * n * 4
    plan_apart(monkeypatch, "large split budget")
    check_product(precision, monkeypatch, "high", torch.randn(m, k), torch.randn(k, n))
    notes = coopmat_notes(plans)
    assert notes and all("K in 3 splits" in s for s in notes), notes


@pytest.mark.parametrize("kind", ["f16", "high", "medium"])
def test_small_tile_long_k_step(precision, plans, monkeypatch, kind):
    """A 64x64 tile, whose K steps of 32 fit a small shared memory (lavapipe's 32 KiB):
    each subgroup then holds as many fragments as the H100's 128x128 tile gives it, and a
    step spans several of the matrices' K."""
    monkeypatch.setattr(coopmat, "TILE", (64, 64))
    monkeypatch.setattr(coopmat, "SUBGROUPS", ((2, 2),))
    plan_apart(monkeypatch, "tile 64x64")
    check_product(precision, monkeypatch, kind, torch.randn(150, 200), torch.randn(200, 136))
    notes = coopmat_notes(plans)
    assert notes and all("tile 64x64x" in s for s in notes), notes
    if kind != "high":
        assert all("tile 64x64x32" in s for s in notes), notes


@pytest.mark.parametrize("kind,pack,splits", [("f16", "AB", None), ("high", "AB", 2), ("medium", "B", None)],
                         ids=str)
def test_packed_operands(precision, plans, monkeypatch, kind, pack, splits):
    """Operands converted to 16 bits first (coopmat_pack.comp; FORCE_PACK): A and B read
    along k and along their rows (the pack's two thread orders), a batch, a batch-broadcast
    operand (one packed copy), edges in M, N and K (the zero padding), K splits. fp16
    tensors are scaled (both operands packed, scaled apart); fp32 here takes the unscaled
    bf16 kernels (SCALED_FOR emptied), whose operands are packed as FORCE_PACK says."""
    monkeypatch.setattr(coopmat, "SCALED_FOR", {})
    monkeypatch.setattr(coopmat, "FORCE_PACK", pack)
    monkeypatch.setattr(coopmat, "FORCE_SPLITS", splits)
    plan_apart(monkeypatch, f"pack {pack}, splits {splits}")
    half = kind == "f16"
    require_coopmat("f16" if half else "bf16", monkeypatch)
    precision("highest" if half else kind)
    cast = (lambda t: t.half()) if half else (lambda t: t)
    bt = lambda x, y: torch.bmm(x.transpose(1, 2), y.transpose(1, 2))
    cases = [(lambda x, y: x @ y, torch.randn(130, 300), torch.randn(300, 96)),
             (bt, torch.randn(2, 70, 140), torch.randn(2, 129, 70)),
             (lambda x, y: torch.bmm(x.expand(3, -1, -1), y), torch.randn(1, 37, 70), torch.randn(3, 70, 50))]
    for fn, a, b in cases:
        a, b = cast(a), cast(b)
        got = compiled(fn)(a, b)
        want = fn(a.float(), b.float())
        if half:
            assert_half_near(got, want, fn(a.float().abs(), b.float().abs()))
        else:
            assert_near(got, want, a.shape[-1] if fn is not bt else a.shape[-2], kind)
    notes = coopmat_notes(plans)
    assert len(notes) >= 3 and all(f", {pack} in 16 bits first" in s for s in notes), notes


@pytest.mark.parametrize("m,k,n", [(100, 60, 17), (40, 300, 24), (37, 700, 33), (20, 1500, 9)], ids=str)
def test_scaled_pack_rows_per_workgroup(precision, plans, monkeypatch, m, k, n):
    """The scaled pack takes several rows a workgroup where they are short
    (coopmat_pack.scaled_rows: 8, 4, 2 and 1 rows along k here) and 8 along its rows (A
    transposed, B of x @ W with W [K, N]), row counts not a multiple of them, each row
    scaled by its own power of two (rows 1e6 apart)."""
    from dynamo_vulkan.lowering.coopmat_pack import scaled_rows
    a = torch.randn(m, k) * torch.logspace(-3, 3, m).unsqueeze(1)
    b = torch.randn(k, n) * torch.logspace(3, -3, n)
    check_product(precision, monkeypatch, "high", a, b)
    check_product(precision, monkeypatch, "high", a.t().contiguous().t(), b)
    packs = [d for p in plans for d in p.dispatches if d.name.startswith("coopmat_pack")]
    assert packs, [d.name for p in plans for d in p.dispatches]
    assert [scaled_rows(False, kp) for kp in (64, 256, 320, 512, 1024, 1536)] == [8, 8, 4, 4, 2, 1]
    assert scaled_rows(True, 4096) == 8 and scaled_rows(False, 64, plain=False) == 1


def test_an_operand_read_by_several_products_is_packed_once(precision, plans, monkeypatch):
    """Three scaled products of one A (a prompt's q, k and v projections of one normalised
    x): A's 16-bit copy is made once and read by all three; an A written in between (the
    in-place add) is packed again."""
    require_coopmat("scaled", monkeypatch)
    precision("high")

    def fn(x, w1, w2, w3):
        y1, y2 = x @ w1, x @ w2
        x = x * 2.0          # a new A: its own copy
        return y1, y2, x @ w3

    x, ws = torch.randn(70, 96), [torch.randn(96, n) for n in (40, 33, 64)]
    got = compiled(fn)(x, *ws)
    for g, a, w in zip(got, (x, x, x * 2.0), ws):
        assert_scaled_near(g, lambda a, b: a @ b, a, w)
    packs = [d.note for p in plans for d in p.dispatches if d.name.startswith("coopmat_pack")]
    assert sum("[1x70x96]" in s for s in packs) == 2, packs            # A: x once, 2x once
    assert len(packs) == 5, packs                                       # and each weight


def assert_gguf_decoded(plans, name: str, rows: int, k: int, tiles_m=(1,)) -> None:
    """W was decoded by the tensor-core path, never through an fp32 copy: in the matmul's
    tile loads for a type whose blocks bound their magnitudes, in products of at most
    INLINE_MAX_TILES_M rows of tiles (no copy of W at all; the callers make W count as
    large: INLINE_MANY_MIN_WEIGHTS); else straight into the fp16 copy (coopmat_pack.comp's
    GGUF). tiles_m: the rows of tiles of the products planned."""
    from dynamo_vulkan.lowering.coopmat_pack import BOUNDED_TYPES, INLINE_MAX_TILES_M
    names = [d.name for p in plans for d in p.dispatches]
    assert not any("dequant" in n for n in names), names
    packs = [d.note for p in plans for d in p.dispatches if d.name.startswith("coopmat_pack")]
    decoded = [s for s in packs if f"{name}[{rows}x{k}] decoded to 16 bits" in s]
    inline = [s for s in coopmat_notes(plans) if f"W decoded from its {name} blocks in the tile loads" in s]
    bounded = name in BOUNDED_TYPES
    want_inline = bounded and any(t <= INLINE_MAX_TILES_M for t in tiles_m)
    want_packed = not bounded or any(t > INLINE_MAX_TILES_M for t in tiles_m)
    assert (bool(inline), bool(decoded)) == (want_inline, want_packed), (packs, coopmat_notes(plans))


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "F16"])
def test_gguf_weights_decoded_from_their_blocks(as_gpu, precision, plans, monkeypatch, name):
    """A prompt's GGUF linear under "high" (planned as for a GPU): W decoded from its blocks
    by the tensor-core path (assert_gguf_decoded), no fp32 copy; rows past the tile (65 of
    64), a strided x, x of one, two and more than INLINE_MAX_TILES_M rows of tiles (W
    decoded in the tile loads, then into its fp16 copy), against eager's x @ W^T."""
    from dynamo_vulkan.gguf import GGUFLinear
    from dynamo_vulkan.gguf.quants import quant_info
    from dynamo_vulkan.lowering import coopmat_pack
    from dynamo_vulkan.lowering import gguf as gguf_lowering
    from dynamo_vulkan.lowering.coopmat_pack import INLINE_MAX_TILES_M
    from gguf_fixtures import blocks_of
    require_coopmat("scaled", monkeypatch)
    precision("high")
    monkeypatch.setattr(coopmat_pack, "INLINE_MANY_MIN_WEIGHTS", 1)      # as for a large W
    monkeypatch.setattr(gguf_lowering, "TC_DECODE_FIRST_M", 64)
    monkeypatch.setattr(gguf_lowering, "DECODE_FIRST_WEIGHTS", 1)
    k = {"Q4_K": 512, "Q6_K": 512, "F16": 136}.get(name, 160)     # F16: K past a K step
    lin = GGUFLinear(blocks_of(name, 65, k, 4), quant_info(name).ggml_type, 65, k)
    w = lin.dequantized_weight()
    bm = coopmat.TILE[0]
    many = INLINE_MAX_TILES_M + 1
    for x in (torch.randn(70, k), torch.randn(66, 2 * k)[:, ::2], torch.randn(bm + 3, k),
              torch.randn(many * bm - 5, k)):
        torch._dynamo.reset()       # a plan for each shape
        with torch.no_grad():
            got = compiled(lin)(x)
        assert_scaled_near(got, lambda a, b: a @ b.t(), x, w)
    assert_gguf_decoded(plans, name, 65, k, tiles_m=(1, 2, many))


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q8_0"])
def test_gguf_weights_decoded_in_k_splits(as_gpu, precision, plans, monkeypatch, name):
    """W decoded in the tile loads with K in 3 slices whose edges cut blocks of 256 (each
    slice bounds its rows over the blocks it meets); one row's blocks made 2^12 larger in
    the first slice only, so that its slices take different scales."""
    from dynamo_vulkan.gguf import GGUFLinear
    from dynamo_vulkan.gguf.quants import quant_info
    from dynamo_vulkan.lowering import gguf as gguf_lowering
    from gguf_fixtures import blocks_of
    require_coopmat("scaled", monkeypatch)
    precision("high")
    monkeypatch.setattr(gguf_lowering, "TC_DECODE_FIRST_M", 64)
    monkeypatch.setattr(gguf_lowering, "DECODE_FIRST_WEIGHTS", 1)
    monkeypatch.setattr(coopmat, "FORCE_SPLITS", 3)
    plan_apart(monkeypatch, "splits 3")
    info = quant_info(name)
    rows, k = 33, 768
    data = blocks_of(name, rows, k, 6).numpy().reshape(rows, k // info.block_size, -1).copy()
    at = D_AT[name]
    d = np.frombuffer(data[5, 0, at:at + 2].tobytes(), np.float16)[0]
    data[5, 0, at:at + 2] = np.frombuffer(np.float16(float(d) * 4096).tobytes(), np.uint8)
    lin = GGUFLinear(torch.from_numpy(data.reshape(-1)), info.ggml_type, rows, k)
    w = lin.dequantized_weight()
    x = torch.randn(70, k)
    with torch.no_grad():
        got = compiled(lin)(x)
    assert_scaled_near(got, lambda a, b: a @ b.t(), x, w)
    assert_gguf_decoded(plans, name, rows, k)
    assert any("K in 3 splits" in s for s in coopmat_notes(plans)), coopmat_notes(plans)


# byte offset of each block's fp16 d in GGML's layout (the types whose rows are scaled from
# their blocks' scales: gguf_blocks.glsl's gb_bound)
D_AT = {"Q4_K": 0, "Q6_K": 208, "Q8_0": 0, "Q4_0": 0}
# (byte range, value) per type that makes every element of a block its type's largest
# magnitude: q = 15 with sub-block scale and min 63 and dmin 0 (Q4_K), q - 32 = -32 with
# scales 127 (Q6_K), q = -128 (Q8_0), q - 8 = -8 (Q4_0)
EXTREME = {"Q4_K": (((2, 4), 0), ((4, 16), 0xFF), ((16, 144), 0xFF)),
           "Q6_K": (((0, 192), 0), ((192, 208), 127)),
           "Q8_0": (((2, 34), 0x80),), "Q4_0": (((2, 18), 0),)}


@pytest.mark.parametrize("name", sorted(D_AT))
def test_gguf_rows_scaled_from_block_scales(as_gpu, precision, plans, monkeypatch, name):
    """Rows whose scale comes from their blocks' scales alone (gb_bound): a row of huge d
    (30000), one of tiny d (1e-4), one of infinite d and one whose every element is its
    type's largest magnitude (against a row of x of ones, the largest fp16 partial sums a
    bound 4x too low would overflow) beside ordinary ones; the finite columns match eager
    within the scaled bound, the infinite row's column is NaN where eager's is."""
    from dynamo_vulkan.gguf import GGUFLinear
    from dynamo_vulkan.gguf.quants import quant_info
    from dynamo_vulkan.lowering import gguf as gguf_lowering
    from gguf_fixtures import blocks_of
    require_coopmat("scaled", monkeypatch)
    precision("high")
    monkeypatch.setattr(gguf_lowering, "TC_DECODE_FIRST_M", 64)
    monkeypatch.setattr(gguf_lowering, "DECODE_FIRST_WEIGHTS", 1)
    info = quant_info(name)
    rows, k = 40, 512
    data = blocks_of(name, rows, k, 5).numpy().reshape(rows, k // info.block_size, -1).copy()
    for row, d in ((0, 30000.0), (1, 1e-4), (2, float("inf")), (3, 0.5)):
        data[row, :, D_AT[name]:D_AT[name] + 2] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
    for (lo, hi), byte in EXTREME[name]:
        data[3, :, lo:hi] = byte
    lin = GGUFLinear(torch.from_numpy(data.reshape(-1)), info.ggml_type, rows, k)
    w = lin.dequantized_weight()
    assert (w[3].abs() == w[3, 0].abs()).all() and w[3, 0] != 0, "row 3 is not at one magnitude"
    x = torch.randn(70, k)
    x[0] = 1.0
    with torch.no_grad():
        got = compiled(lin)(x)
    want = x @ w.t()
    finite = [c for c in range(rows) if c != 2]
    assert_scaled_near(got[:, finite], lambda a, b: a @ b.t(), x, w[finite])
    assert torch.equal(got[:, 2].isnan(), want[:, 2].isnan()) and want[:, 2].isnan().all()
    assert_gguf_decoded(plans, name, rows, k)


class _NormedQKV(torch.nn.Module):
    """A decoder's attention input: q, k and v projections of one rms_norm(x)."""

    def __init__(self, lins, weight):
        super().__init__()
        self.lins = torch.nn.ModuleList(lins)
        self.register_buffer("weight", weight)

    def forward(self, x):
        from dynamo_vulkan.fused import rms_norm
        h = rms_norm(x, self.weight, 1e-6)
        return tuple(lin(h) for lin in self.lins)


@pytest.mark.parametrize("prec", ["high", "highest"])
def test_prompt_norm_computed_in_the_16_bit_copy(as_gpu, precision, plans, monkeypatch, prec):
    """A prompt's rms_norm read only by GGUF linears (q, k and v; planned as a GPU): under
    "high" the scaled tensor-core path normalises x in its 16-bit copy, made once for the
    three (no norm kernel); under "highest" the norm runs once as its own kernel. Rows past
    a tile, a weight far from 1, against eager's."""
    from dynamo_vulkan.fused import rms_norm
    from dynamo_vulkan.gguf import GGUFLinear
    from dynamo_vulkan.gguf.quants import quant_info
    from dynamo_vulkan.lowering import gguf as gguf_lowering
    from gguf_fixtures import blocks_of
    require_coopmat("scaled", monkeypatch)
    precision(prec)
    monkeypatch.setattr(gguf_lowering, "TC_DECODE_FIRST_M", 64)
    monkeypatch.setattr(gguf_lowering, "DECODE_FIRST_WEIGHTS", 1)
    k = 512
    lins = [GGUFLinear(blocks_of(name, rows, k, seed), quant_info(name).ggml_type, rows, k)
            for name, rows, seed in (("Q4_K", 48, 1), ("Q4_K", 16, 2), ("Q6_K", 16, 3))]
    weight = torch.rand(k) * 30.0 + 0.5
    x = torch.randn(70, k) * 5.0
    with torch.no_grad():
        got = compiled(_NormedQKV(lins, weight))(x)
    h = rms_norm(x, weight, 1e-6)
    names = [d.name for p in plans for d in p.dispatches]
    normed = [d.note for p in plans for d in p.dispatches
              if d.name.startswith("coopmat_pack") and d.note.startswith("rms_norm of [1x70x512]")]
    for g, lin in zip(got, lins):
        w = lin.dequantized_weight()
        if prec == "high":
            assert_scaled_near(g, lambda a, b: a @ b.t(), h, w)
        else:        # fp32 sums in another order: within fp32's rounding of the products' sizes
            scale = float((h.abs() @ w.abs().t()).max())
            torch.testing.assert_close(g, h @ w.t(), rtol=1e-5, atol=1e-5 * scale)
    if prec == "high":
        assert len(normed) == 1 and "rowwise:rms_norm" not in names, (normed, names)
    else:
        assert not normed and names.count("rowwise:rms_norm") == 1, names


class _SwiGLUDown(torch.nn.Module):
    """A decoder's FFN tail: down(silu(gate) * up), gate and up halves of one [m, 2k]
    product (strided rows, as the fused gate|up gives them)."""

    def __init__(self, lin):
        super().__init__()
        self.lin = lin

    def forward(self, gu):
        k = gu.shape[-1] // 2
        return self.lin(torch.nn.functional.silu(gu[:, :k]) * gu[:, k:])


@pytest.mark.parametrize("prec,kept", [("high", 12), ("high", 0), ("highest", 12)], ids=str)
def test_prompt_swiglu_computed_in_the_16_bit_copy(as_gpu, precision, plans, monkeypatch, prec, kept):
    """A prompt's silu(gate) * up read only by a GGUF linear (planned as a GPU): under "high"
    the scaled tensor-core path computes it in its 16-bit copy of x (no elementwise kernel,
    no fp32 copy of it), its values kept in registers between the row's maximum and the
    stores or (kept 0) computed again; under "highest" the tiled GGUF kernel reads it
    computed first. Rows past a tile, against eager's down(silu(gate) * up)."""
    from dynamo_vulkan.lowering import coopmat_pack
    monkeypatch.setattr(coopmat_pack, "LAZY_KEPT_OCTETS", kept)
    plan_apart(monkeypatch, f"kept {kept}")
    from dynamo_vulkan.gguf import GGUFLinear
    from dynamo_vulkan.gguf.quants import quant_info
    from dynamo_vulkan.lowering import gguf as gguf_lowering
    from gguf_fixtures import blocks_of
    require_coopmat("scaled", monkeypatch)
    precision(prec)
    monkeypatch.setattr(gguf_lowering, "TC_DECODE_FIRST_M", 64)
    monkeypatch.setattr(gguf_lowering, "DECODE_FIRST_WEIGHTS", 1)
    rows, k = 40, 512
    lin = GGUFLinear(blocks_of("Q4_K", rows, k, 7), quant_info("Q4_K").ggml_type, rows, k)
    w = lin.dequantized_weight()
    gu = torch.randn(70, 2 * k)
    x = torch.nn.functional.silu(gu[:, :k]) * gu[:, k:]
    with torch.no_grad():
        got = compiled(_SwiGLUDown(lin))(gu)
    swiglu = [d.note for p in plans for d in p.dispatches
              if d.name.startswith("elementwise") and "sigmoid" in d.note]      # silu(gate) * up
    lazy_packs = [d.note for p in plans for d in p.dispatches
                  if d.name.startswith("coopmat_pack") and "elementwise [70x512] computed" in d.note]
    if prec == "high":
        assert_scaled_near(got, lambda a, b: a @ b.t(), x, w)
        assert len(lazy_packs) == 1 and not swiglu, (lazy_packs, swiglu)
        pack = next(d for p in plans for d in p.dispatches if d.name == "coopmat_pack:f16 lazy")
        source = str(next(p for p in plans if pack in p.dispatches).sources[pack.spirv_key])
        assert ("#define LZ_OCT" in source) == (kept > 0)
    else:
        torch.testing.assert_close(got, x @ w.t(), rtol=1e-4, atol=1e-4)
        assert not lazy_packs and len(swiglu) == 1, (lazy_packs, swiglu)


def test_packing_follows_reads(monkeypatch):
    """Auto: an operand is converted first where PACK_MIN_READS or more tiles read it."""
    many = coopmat.PACK_MIN_READS
    assert coopmat.packed_operands(many, many) == "AB"
    assert coopmat.packed_operands(1, many) == "A"      # one row of tiles: B read once
    assert coopmat.packed_operands(many, 1) == "B"
    assert coopmat.packed_operands(many - 1, many - 1) == ""


# ------------------------------------------------------------------ everywhere
def _ctx(dtype=torch.float32, prec="highest", caps=BF16_CAPS):
    node = types.SimpleNamespace(meta={"val": torch.empty(0, dtype=dtype)})
    return types.SimpleNamespace(caps=dict(caps), node=node,
                                 cfg=types.SimpleNamespace(matmul_precision=prec, tensor_cores="auto"))


def test_choice_follows_precision(monkeypatch):
    """"highest" never takes tensor cores, even where the device has them; with fp16 x fp16
    + fp32 matrices "high", "medium" and fp16 tensors take scaled fp16, summed in fp32
    except under "medium" where fp16 partial sums of the same shape exist (the H100's and
    H200's shapes); without fp16 matrices "high" takes bf16x3, "medium" bf16; without the
    device's support, fp32 kernels with the reason in the note."""
    monkeypatch.setattr(shaders, "coopmat_glslc", lambda: "/nonexistent/glslc-coopmat")
    assert coopmat.choose(_ctx(prec="highest"), 1, 512, 512, 512) == coopmat.Choice(None, "")
    assert coopmat.choose(_ctx(prec="highest", caps=SCALED_CAPS), 1, 512, 512, 512) == coopmat.Choice(None, "")
    for ctx, sums16 in ((_ctx(prec="high", caps=SCALED_CAPS), False),
                        (_ctx(prec="medium", caps=SCALED_CAPS), True),
                        (_ctx(torch.float16, caps=SCALED_CAPS), False),
                        (_ctx(prec="high"), False), (_ctx(prec="medium"), False),
                        (_ctx(torch.float16), False)):
        c = coopmat.choose(ctx, 1, 512, 512, 512)
        plan = c.plan
        assert (plan.dtype, plan.scaled, plan.split3, plan.bk) == ("f16", True, False, 32)
        assert {"SCALED", "CM_F16"} <= set(plan.defines())
        assert ("ACC16" in plan.defines()) == sums16 == ("fp16 sums of 128" in c.note), c.note
    plan = coopmat.choose(_ctx(torch.bfloat16, caps=SCALED_CAPS), 1, 512, 512, 512).plan
    assert (plan.dtype, plan.scaled) == ("bf16", False)
    bf16_only = dict(BF16_CAPS, cooperative_matrix_shapes=BF16_CAPS["cooperative_matrix_shapes"][1:])
    high = coopmat.choose(_ctx(prec="high", caps=bf16_only), 1, 512, 512, 512).plan
    medium = coopmat.choose(_ctx(prec="medium", caps=bf16_only), 1, 512, 512, 512).plan
    assert (high.dtype, high.split3, medium.dtype, medium.split3) == ("bf16", True, "bf16", False)
    half = coopmat.choose(_ctx(torch.float16, "highest"), 1, 512, 512, 512).plan
    assert (half.dtype, half.split3, half.cm) == ("f16", False, (16, 16, 16))
    # the H100's tiles: 16x16x16, K steps of 32, of 16 for bf16x3's two planes in 48 KiB
    assert [(p.cm, p.bm, p.bn, p.bk) for p in (high, medium, half)] == \
        [((16, 16, 16), 128, 128, 16), ((16, 16, 16), 128, 128, 32), ((16, 16, 16), 128, 128, 32)]
    for p in (high, medium, half):
        assert coopmat.shared_bytes(p.bm, p.bn, p.bk, p.cm, p.split3, p.sg) <= 49152
    assert {p.sg for p in (high, medium, half)} == {(4, 4)}
    no_bf16 = dict(bf16_only, bfloat16_cooperative_matrix=False)
    c = coopmat.choose(_ctx(prec="high", caps=no_bf16), 1, 512, 512, 512)
    assert c.plan is None and "no bf16 cooperative matrices" in c.note
    c = coopmat.choose(_ctx(prec="medium", caps={"cooperative_matrix": False}), 1, 64, 64, 64)
    assert c.plan is None and "no cooperative matrices" in c.note
    monkeypatch.setattr(shaders, "coopmat_glslc", lambda: None)
    c = coopmat.choose(_ctx(prec="high"), 1, 512, 512, 512)
    assert c.plan is None and "glslc" in c.note


def test_subgroups_within_the_devices_workgroups(monkeypatch):
    """16 subgroups a workgroup where the device allows 16 x 32 invocations, else 8 (the
    tile's rows per subgroup double), else no tensor cores, with the reason."""
    monkeypatch.setattr(shaders, "coopmat_glslc", lambda: "/nonexistent/glslc-coopmat")
    sgs = []
    for most in (1024, 512, 256):
        caps = dict(SCALED_CAPS, max_compute_work_group_invocations=most)
        plan = coopmat.choose(_ctx(prec="high", caps=caps), 1, 512, 512, 512).plan
        sgs.append(plan.sg)
        assert plan.defines()["SG_M"] * plan.defines()["SG_N"] * 32 <= most
        assert f"in {plan.sg[0]}x{plan.sg[1]} subgroups" in plan.label
    assert sgs == [(4, 4), (4, 4), (2, 4)]
    c = coopmat.choose(_ctx(prec="high", caps=dict(SCALED_CAPS, max_compute_work_group_invocations=128)),
                       1, 512, 512, 512)
    assert c.plan is None and "exceeds the device's invocations" in c.note


def test_highest_program_keeps_fp32_kernels(monkeypatch, precision, plans):
    """A device claiming tensor cores still gets today's tiled kernel under "highest"."""
    info = dict(device.device_info(), **BF16_CAPS)
    monkeypatch.setattr(device, "device_info", lambda index=None: info)
    monkeypatch.setenv("DYNAMO_VULKAN_CPU_MATMUL", "vulkan")
    precision("highest")
    a, b = torch.randn(65, 40), torch.randn(40, 70)
    torch.testing.assert_close(compiled(lambda x, y: x @ y + 1)(a, b), a @ b + 1, rtol=1e-4, atol=1e-4)
    names = [d.name for p in plans for d in p.dispatches]
    assert any(n.startswith("matmul:") for n in names) and not any("coopmat" in n for n in names), names


def test_precision_is_in_the_cache_key(precision):
    precision("high")
    high = config.load()
    precision("highest")
    assert (high.matmul_precision, config.load().matmul_precision) == ("high", "highest")
    assert high.key() != config.load().key()
    with pytest.raises(config.ConfigError):
        config.load({"matmul_precision": "tf32"})


COMPILED_PLANS = [("bf16", True, (16, 16, 16), 32, 16), ("bf16", False, (16, 16, 16), 32, 32),
                  ("f16", False, (16, 16, 16), 32, 32), ("f16", False, (8, 8, 8), 8, 16),
                  ("bf16", True, (16, 8, 16), 32, 16)]


@pytest.mark.parametrize("cm,subgroup", [((16, 16, 16), 32), ((8, 8, 8), 8)], ids=str)
def test_scaled_kernels_compile_with_the_second_glslc(cm, subgroup):
    """The scaled fp16 matmul (both operands packed, with and without bias; B decoded from
    each bounded GGUF type's blocks; fp32 sums and fp16 partial sums) and its pack (along k
    and along rows)."""
    from dynamo_vulkan.lowering.coopmat_pack import BOUNDED_TYPES
    if shaders.coopmat_glslc() is None:
        pytest.skip("no glslc for cooperative-matrix kernels here (scripts/glslc_coopmat.sh installs one)")
    sums32, sums16 = (coopmat.Plan("f16", False, cm, *coopmat.TILE, 32, subgroup, True, products)
                      for products in (0, 128))
    packed = {"A_PACKED": 1, "A_ALONG_K": 1, "B_PACKED": 1, "B_ALONG_K": 1}
    sources = [("matmul_coopmat", packed | extra | plan.defines())
               for extra in ({}, {"HAS_BIAS": 1}) for plan in (sums32, sums16)]
    sources += [("matmul_coopmat", {"A_PACKED": 1, "A_ALONG_K": 1, "B_ALONG_K": 1, "B_GGUF": 1,
                                    f"QTYPE_{t}": 1} | plan.defines())
                for t in sorted(BOUNDED_TYPES) for plan in (sums32, sums16)]
    sources += [("coopmat_pack", {"CM_F16": 1, "SCALED": 1} | extra)
                for extra in ({}, {"SROWS": 4}, {"ALONG_ROWS": 1, "SROWS": 8})]
    for name, defines in sources:
        _, src = kernel_source(name, defines)
        assert compile_source(src, name)[:4] == b"\x03\x02\x23\x07", defines


@pytest.mark.parametrize("index", range(len(COMPILED_PLANS)),
                         ids=["bf16x3", "bf16", "f16", "f16-8x8x8", "bf16x3-16x8x16"])
def test_kernel_compiles_with_the_second_glslc(index):
    """Each of the 32 load and layout variants (A and B along k or not, 16-byte loads or
    not, bias) with one of the plans, every plan with several."""
    if shaders.coopmat_glslc() is None:
        pytest.skip("no glslc for cooperative-matrix kernels here (scripts/glslc_coopmat.sh installs one)")
    dtype, split3, cm, subgroup, bk = COMPILED_PLANS[index]
    plan = coopmat.Plan(dtype, split3, cm, *coopmat.TILE, bk, subgroup)
    for bits in range(index, 32, len(COMPILED_PLANS)):
        names = [n for i, n in enumerate(("A_ALONG_K", "A_VEC4", "B_ALONG_K", "B_VEC4", "HAS_BIAS")) if bits >> i & 1]
        _, src = kernel_source("matmul_coopmat", dict.fromkeys(names, 1) | plan.defines())
        spv = compile_source(src, "matmul_coopmat")
        assert spv[:4] == b"\x03\x02\x23\x07", names     # the SPIR-V magic number


def test_tensor_cores_off(monkeypatch, precision, plans):
    """DYNAMO_VULKAN_TENSOR_CORES=off: fp32 kernels under "high", the note says why."""
    monkeypatch.setattr(shaders, "coopmat_glslc", lambda: "/nonexistent/glslc-coopmat")
    ctx = _ctx(prec="high")
    ctx.cfg.tensor_cores = "off"
    c = coopmat.choose(ctx, 1, 512, 512, 512)
    assert c.plan is None and "DYNAMO_VULKAN_TENSOR_CORES=off" in c.note
    half = _ctx(torch.float16)
    half.cfg.tensor_cores = "off"
    assert coopmat.choose(half, 1, 512, 512, 512).plan is None
    info = dict(device.device_info(), **BF16_CAPS)
    monkeypatch.setattr(device, "device_info", lambda index=None: info)
    monkeypatch.setenv("DYNAMO_VULKAN_CPU_MATMUL", "vulkan")
    monkeypatch.setenv("DYNAMO_VULKAN_TENSOR_CORES", "off")
    precision("high")
    a, b = torch.randn(65, 40), torch.randn(40, 70)
    torch.testing.assert_close(compiled(lambda x, y: x @ y)(a, b), a @ b, rtol=1e-4, atol=1e-4)
    names = [d.name for p in plans for d in p.dispatches]
    assert any(n.startswith("matmul:") for n in names) and not any("coopmat" in n for n in names), names


def test_tensor_cores_are_on_by_default(monkeypatch):
    """Without DYNAMO_VULKAN_TENSOR_CORES, "high" matmuls take tensor cores where the device
    has them, and "highest" (torch's default) never does."""
    monkeypatch.delenv("DYNAMO_VULKAN_TENSOR_CORES")
    monkeypatch.setattr(shaders, "coopmat_glslc", lambda: "/nonexistent/glslc-coopmat")
    assert config.load().tensor_cores == "auto"
    for prec, taken in (("high", True), ("highest", False)):
        ctx = _ctx(prec=prec, caps=SCALED_CAPS)
        ctx.cfg = config.load({"matmul_precision": prec})
        assert (coopmat.choose(ctx, 1, 256, 256, 256).plan is not None) == taken


def test_gguf_copies_beside_the_previous_product(as_gpu, precision, plans, monkeypatch):
    """A prompt of more rows of tiles than decode W in their tile loads
    (coopmat_pack.INLINE_MAX_TILES_M), three GGUF linears in a row (gelu between): each W's
    fp16 copy after the first runs in the barrier level of the product before it
    (lowering/schedule.py), in a buffer no other dispatch of that level binds; results
    within the scaled bound of eager's."""
    from dynamo_vulkan.gguf import GGUFLinear
    from dynamo_vulkan.gguf.quants import quant_info
    from dynamo_vulkan.lowering import gguf as gguf_lowering
    from dynamo_vulkan.lowering.coopmat_pack import INLINE_MAX_TILES_M
    from gguf_fixtures import blocks_of
    from vk import assert_copies_beside_products
    require_coopmat("scaled", monkeypatch)
    precision("high")
    monkeypatch.setattr(gguf_lowering, "TC_DECODE_FIRST_M", 64)
    monkeypatch.setattr(gguf_lowering, "DECODE_FIRST_WEIGHTS", 1)
    k = 256
    monkeypatch.setattr(schedule, "AHEAD_MIN_BYTES", 0)       # copies of 128 KiB
    lins = [GGUFLinear(blocks_of(name, k, k, i), quant_info(name).ggml_type, k, k)
            for i, name in enumerate(("Q4_K", "Q5_1", "Q6_K"))]
    x = torch.randn((INLINE_MAX_TILES_M + 1) * coopmat.TILE[0] - 5, k)
    with torch.no_grad():
        got = compiled(lambda x: lins[2](torch.nn.functional.gelu(lins[1](torch.nn.functional.gelu(lins[0](x))))))(x)
        h = x
        for i, lin in enumerate(lins):
            w = lin.dequantized_weight()
            if i == 2:
                assert_scaled_near(got, lambda a, b: a @ b.t(), h, w)
            h = torch.nn.functional.gelu(h @ w.t())
    assert assert_copies_beside_products(plans, "coopmat_pack:Q", "matmul_coopmat") == 2


class _DownPlus(torch.nn.Module):
    """lin(x) + r, x as given or silu(gate) * up of [m, 2k] (swiglu)."""

    def __init__(self, lin, swiglu):
        super().__init__()
        self.lin, self.swiglu = lin, swiglu

    def forward(self, x, r):
        if self.swiglu:
            k = x.shape[-1] // 2
            x = torch.nn.functional.silu(x[:, :k]) * x[:, k:]
        return self.lin(x) + r


@pytest.mark.parametrize("swiglu,rows", [(False, 70), (True, 70), (False, 1)], ids=str)
def test_prompt_residual_in_the_tensor_cores_epilogue(as_gpu, precision, plans, monkeypatch, swiglu, rows):
    """A prompt's GGUF linear on the scaled tensor cores (x plain, or silu * up computed in
    its 16-bit copy) adds a residual of its shape, or a bias row, in its epilogue: the
    residual is read by the matmul alone; the product within the scaled bound of eager's."""
    from dynamo_vulkan.gguf import GGUFLinear
    from dynamo_vulkan.gguf.quants import quant_info
    from dynamo_vulkan.lowering import gguf as gguf_lowering
    from gguf_fixtures import blocks_of
    require_coopmat("scaled", monkeypatch)
    precision("high")
    monkeypatch.setattr(gguf_lowering, "TC_DECODE_FIRST_M", 64)
    monkeypatch.setattr(gguf_lowering, "DECODE_FIRST_WEIGHTS", 1)
    n, k = 40, 512
    lin = GGUFLinear(blocks_of("Q4_K", n, k, 8), quant_info("Q4_K").ggml_type, n, k)
    w = lin.dequantized_weight()
    xin = torch.randn(70, 2 * k if swiglu else k)
    r = torch.randn(rows, n) * 10.0
    with torch.no_grad():
        got = compiled(_DownPlus(lin, swiglu))(xin, r)
    x = torch.nn.functional.silu(xin[:, :k]) * xin[:, k:] if swiglu else xin
    assert_scaled_near(got - r, lambda a, b: a @ b.t(), x, w)
    (plan,) = plans
    r_buf = plan.inputs[-1].buffer
    readers = [d.name for d in plan.dispatches if r_buf in d.bindings]
    assert readers == ["matmul_coopmat:coopmat"], [(d.name, d.note) for d in plan.dispatches]
