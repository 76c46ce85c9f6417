"""Tensor-core matmuls (lowering/coopmat.py, shaders/matmul_coopmat.comp).

On a device with cooperative matrices: fp32 products under torch's "high" (bf16x3) and
"medium" (bf16) precision and fp16 tensors' products against eager fp32, within the
tolerances torch uses for TF32 and bf16, on odd shapes, tile edges (M, N past a tile; K
not a multiple of the K step), interior tiles stored directly and through the scratch,
size-1 dimensions, transposed and batched operands, K splits and fused bias and alpha.
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
import torch

from dynamo_vulkan import config, device, shaders
from dynamo_vulkan.lowering import coopmat
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


@pytest.fixture(autouse=True)
def _tensor_cores_on(monkeypatch):
    """The tensor-core kernels are opt-in (DYNAMO_VULKAN_TENSOR_CORES=auto): on here."""
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


# ------------------------------------------------------------------ on tensor cores
@pytest.mark.parametrize("prec", ["high", "medium"])
@pytest.mark.parametrize("m,k,n", SHAPES, ids=str)
def test_mm(precision, plans, monkeypatch, prec, m, k, n):
    require_coopmat("bf16", monkeypatch)
    precision(prec)
    a, b = torch.randn(m, k), torch.randn(k, n)
    got = compiled(lambda x, y: x @ y)(a, b)
    assert_near(got, a @ b, k, prec)
    notes = coopmat_notes(plans)
    assert notes and all(("bf16x3" if prec == "high" else "bf16 ") in s for s in notes), notes


@pytest.mark.parametrize("prec", ["high", "medium"])
def test_transposed_batched_bias(precision, plans, monkeypatch, prec):
    """A^T and B^T read through their strides (the column-major shared layouts), a batch,
    baddbmm's alpha, beta and broadcast bias fused, nn.Linear's x @ W^T + b."""
    require_coopmat("bf16", monkeypatch)
    precision(prec)
    a, b = torch.randn(3, 70, 65), torch.randn(3, 41, 70)
    bias = torch.randn(65, 1)

    def fn(x, y, c):
        return torch.baddbmm(c, x.transpose(1, 2), y.transpose(1, 2), beta=0.5, alpha=2.0)
    got = compiled(fn)(a, b, bias)
    assert_near(got, fn(a, b, bias), 70, prec)
    x, w, wb = torch.randn(2, 37, 96), torch.randn(200, 96), torch.randn(200)
    lin = lambda x, w, wb: torch.nn.functional.linear(x, w, wb)
    assert_near(compiled(lin)(x, w, wb), lin(x, w, wb), 96, prec)
    assert len(coopmat_notes(plans)) >= 2


def test_fp32_values_keep_their_range(precision, monkeypatch):
    """bf16 keeps fp32's exponents: 1e30-sized operands stay finite and accurate."""
    require_coopmat("bf16", monkeypatch, emulate=False)
    precision("high")
    a, b = torch.randn(40, 64) * 1e30, torch.randn(64, 24) * 1e-32
    assert_near(compiled(lambda x, y: x @ y)(a, b), a @ b, 64, "high")


def assert_half_near(got, want):
    """fp16 results of fp32 sums of exact products: within one fp16 rounding of eager's."""
    assert got.dtype == torch.float16
    torch.testing.assert_close(got.float(), want.float(), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("m,k,n", [(17, 9, 33), (129, 130, 131), (256, 80, 260), (300, 101, 384)], ids=str)
def test_fp16_tensors(precision, plans, monkeypatch, m, k, n):
    """fp16 tensors on fp16 tensor cores under any precision: exact products, fp32 sums."""
    require_coopmat("f16", monkeypatch)
    precision("highest")
    a, b = torch.randn(m, k).half(), torch.randn(k, n).half()
    assert_half_near(compiled(lambda x, y: x @ y)(a, b), (a.float() @ b.float()).half())
    assert any("f16" in s for s in coopmat_notes(plans))


def test_fp16_transposed_batched_bias_alpha(precision, plans, monkeypatch):
    """fp16: the column-major shared layouts (A^T, B^T through their strides) in a batch;
    nn.Linear's bias and addmm's alpha, beta and bias fused (the scratch epilogue); alpha
    alone on whole interior tiles (the direct stores, scaled)."""
    require_coopmat("f16", monkeypatch)
    precision("highest")
    a, b = torch.randn(2, 70, 140).half(), torch.randn(2, 129, 70).half()
    bt = lambda x, y: torch.bmm(x.transpose(1, 2), y.transpose(1, 2))
    assert_half_near(compiled(bt)(a, b), torch.bmm(a.float().transpose(1, 2), b.float().transpose(1, 2)).half())
    x, w, wb = torch.randn(2, 37, 96).half(), torch.randn(200, 96).half(), torch.randn(200).half()
    lin = lambda x, w, wb: torch.nn.functional.linear(x, w, wb)
    assert_half_near(compiled(lin)(x, w, wb), (x.float() @ w.float().t() + wb.float()).half())
    am = lambda c, x, y: torch.addmm(c, x, y, beta=0.5, alpha=2.0)
    assert_half_near(compiled(am)(wb, x[0], w.t()), (0.5 * wb.float() + 2.0 * x[0].float() @ w.float().t()).half())
    x, y, c = torch.randn(256, 40).half(), torch.randn(40, 256).half(), torch.randn(256).half()
    scaled = lambda c, x, y: torch.addmm(c, x, y, beta=0.0, alpha=0.25)
    assert_half_near(compiled(scaled)(c, x, y), (0.25 * x.float() @ y.float()).half())
    assert len(coopmat_notes(plans)) >= 4, coopmat_notes(plans)


def check_product(precision, monkeypatch, kind, a, b):
    """a @ b compiled against eager: "f16" as fp16 tensors (within one fp16 rounding),
    "high" or "medium" as fp32 under that precision (assert_near's bound for it)."""
    if kind == "f16":
        require_coopmat("f16", monkeypatch)
        precision("highest")
        a, b = a.half(), b.half()
        assert_half_near(compiled(lambda x, y: x @ y)(a, b), (a.float() @ b.float()).half())
    else:
        require_coopmat("bf16", monkeypatch)
        precision(kind)
        assert_near(compiled(lambda x, y: x @ y)(a, b), a @ b, a.shape[1], kind)


@pytest.mark.parametrize("dtype", ["f16", "high"])
def test_k_splits(precision, plans, monkeypatch, dtype):
    """K in slices (each its own K range, partial products summed after), uneven last."""
    monkeypatch.setattr(coopmat, "FORCE_SPLITS", 3)
    plan_apart(monkeypatch, "3 K splits")
    check_product(precision, monkeypatch, dtype, torch.randn(130, 300), torch.randn(300, 96))
    assert any("K in 3 splits" in s for s in coopmat_notes(plans)), coopmat_notes(plans)


@pytest.mark.parametrize("kind", ["f16", "high", "medium"])
def test_small_tile_long_k_step(precision, plans, monkeypatch, kind):
    """A 64x64 tile, whose K steps of 32 fit a small shared memory (lavapipe's 32 KiB):
    each subgroup then holds as many fragments as the H100's 128x128 tile gives it, and a
    step spans several of the matrices' K."""
    monkeypatch.setattr(coopmat, "TILE", (64, 64))
    plan_apart(monkeypatch, "tile 64x64")
    check_product(precision, monkeypatch, kind, torch.randn(150, 200), torch.randn(200, 136))
    notes = coopmat_notes(plans)
    assert notes and all("tile 64x64x" in s for s in notes), notes
    if kind != "high":
        assert all("tile 64x64x32" in s for s in notes), notes


@pytest.mark.parametrize("kind,pack,splits", [("f16", "AB", None), ("high", "AB", 2), ("medium", "A", None),
                                               ("high", "B", None)], ids=str)
def test_packed_operands(precision, plans, monkeypatch, kind, pack, splits):
    """Operands converted to 16 bits first (coopmat_pack.comp; FORCE_PACK): A and B read
    along k and along their rows (the pack's two thread orders), a batch, a batch-broadcast
    operand (one packed copy), edges in M, N and K (the zero padding), K splits."""
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
            assert_half_near(got, want.half())
        else:
            assert_near(got, want, a.shape[-1] if fn is not bt else a.shape[-2], kind)
    notes = coopmat_notes(plans)
    assert len(notes) >= 3 and all(f", {pack} in 16 bits first" in s for s in notes), notes


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
    """"highest" never takes tensor cores, even where the device has them; "high" takes
    bf16x3, "medium" bf16, fp16 tensors fp16 always; without the device's support, fp32
    kernels with the reason in the note."""
    monkeypatch.setattr(shaders, "coopmat_glslc", lambda: "/nonexistent/glslc-coopmat")
    assert coopmat.choose(_ctx(prec="highest"), 1, 512, 512, 512) == coopmat.Choice(None, "")
    high = coopmat.choose(_ctx(prec="high"), 1, 512, 512, 512).plan
    medium = coopmat.choose(_ctx(prec="medium"), 1, 512, 512, 512).plan
    assert (high.dtype, high.split3, medium.dtype, medium.split3) == ("bf16", True, "bf16", False)
    half = coopmat.choose(_ctx(torch.float16, "highest"), 1, 512, 512, 512).plan
    assert (half.dtype, half.split3, half.cm) == ("f16", False, (16, 16, 16))
    # the H100's tiles: 16x16x16, K steps of 32, of 16 for bf16x3's two planes in 48 KiB
    assert [(p.cm, p.bm, p.bn, p.bk) for p in (high, medium, half)] == \
        [((16, 16, 16), 128, 128, 16), ((16, 16, 16), 128, 128, 32), ((16, 16, 16), 128, 128, 32)]
    for p in (high, medium, half):
        assert coopmat.shared_bytes(p.bm, p.bn, p.bk, p.cm, p.split3) <= 49152
    no_bf16 = dict(BF16_CAPS, bfloat16_cooperative_matrix=False)
    c = coopmat.choose(_ctx(prec="high", caps=no_bf16), 1, 512, 512, 512)
    assert c.plan is None and "no bf16 cooperative matrices" in c.note
    c = coopmat.choose(_ctx(prec="medium", caps={"cooperative_matrix": False}), 1, 64, 64, 64)
    assert c.plan is None and "no cooperative matrices" in c.note
    monkeypatch.setattr(shaders, "coopmat_glslc", lambda: None)
    c = coopmat.choose(_ctx(prec="high"), 1, 512, 512, 512)
    assert c.plan is None and "glslc" in c.note


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


def test_tensor_cores_are_off_by_default(monkeypatch):
    """Unless DYNAMO_VULKAN_TENSOR_CORES=auto asks for them, "high" and fp16 matmuls keep
    the fp32 kernels (the tensor-core ones are correct but not yet faster)."""
    monkeypatch.delenv("DYNAMO_VULKAN_TENSOR_CORES")
    assert config.load().tensor_cores == "off"
    ctx = _ctx(prec="high")
    ctx.cfg = config.load({"matmul_precision": "high"})
    c = coopmat.choose(ctx, 1, 256, 256, 256)
    assert c.plan is None and "DYNAMO_VULKAN_TENSOR_CORES=off" in c.note
