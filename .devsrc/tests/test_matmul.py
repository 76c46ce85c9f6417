"""Matmul family (lowering/matmul.py) against eager CPU: the tiled kernel (every tile,
forced and planned as a GPU), its tile choice, the COLS mat-vec (B along n) and the
skinny one (B along k), K splits. Inputs are uploaded contiguous, so an operand that
must reach a kernel strided, transposed or at an odd offset is a view taken inside
the compiled function."""
import pytest
import torch
import torch.nn.functional as F

from dynamo_vulkan import device
from dynamo_vulkan.lowering import matmul as mm_lowering
from dynamo_vulkan.lowering.core import LoweringError, has_cpu_lanes
from vk import check, compiled, noncontig

torch.manual_seed(0)
SIZES = [(1, 1, 1), (1, 64, 7), (5, 3, 9), (8, 300, 33), (9, 40, 5), (65, 130, 67), (128, 64, 256), (3, 17, 1)]
GPU = "PHYSICAL_DEVICE_TYPE_DISCRETE_GPU"


def tol(k, scale=1.0):
    return {"rtol": 1e-4, "atol": scale * 1e-4 * max(k, 1) ** 0.5}


def kernels(plans):
    """(dispatch, its #defines) of every kernel the test's programs run, in order."""
    out = []
    for p in plans:
        for d in p.dispatches:
            defines = {}
            for line in p.sources[d.spirv_key].splitlines()[1:]:   # after #version
                if not line.startswith("#define "):
                    break
                _, name, value = line.split(" ", 2)
                defines[name] = value
            out.append((d, defines))
    return out


def cpu_kernel() -> str:
    """A CPU device's prompt matmul: CPU_LANES where its subgroups hold 8 lanes (lavapipe's
    256-bit build), else the CPU_TILE tiled kernel (its 128-bit build: subgroups of 4)."""
    if has_cpu_lanes(device.device_info()):
        return "matmul:lanes"
    return f"matmul:{mm_lowering.CPU_TILE.name}"


def only_kernel(plans, name):
    ks = kernels(plans)
    assert [d.name for d, _ in ks] == [name], [(d.name, d.note) for d, _ in ks]
    return ks[0]


# ---------------------------------------------------------------- the committed tests
@pytest.mark.parametrize("m,k,n", SIZES, ids=str)
def test_mm(m, k, n):
    check(torch.mm, torch.randn(m, k), torch.randn(k, n), rtol=1e-4, atol=1e-4 * k ** 0.5)


@pytest.mark.parametrize("m,k,n", SIZES[:4], ids=str)
def test_mm_transposed_operands(m, k, n):
    a, b = torch.randn(k, m).t(), noncontig(torch.randn(n, k)).t()
    check(torch.mm, a, b, atol=1e-4 * k ** 0.5)


@pytest.mark.parametrize("b,m,k,n", [(1, 3, 4, 5), (7, 1, 33, 9), (3, 65, 65, 65)], ids=str)
def test_bmm(b, m, k, n):
    check(torch.bmm, torch.randn(b, m, k), torch.randn(b, k, n), atol=1e-4 * k ** 0.5)


def test_bmm_broadcast_batch():
    x = torch.randn(4, 1, 6, 5)
    y = torch.randn(3, 5, 2)
    check(torch.matmul, x, y)


@pytest.mark.parametrize("bias_shape", [(9,), (1, 9), (5, 9), ()], ids=str)
def test_addmm(bias_shape):
    check(lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2.0),
          torch.randn(bias_shape), torch.randn(5, 7), torch.randn(7, 9))


def test_linear():
    check(F.linear, torch.randn(2, 3, 20), torch.randn(11, 20), torch.randn(11), atol=2e-4)


@pytest.mark.parametrize("case", ["mm", "bmm", "addmm", "transposed"])
def test_k_split_on_a_gpu(as_gpu, plans, case):
    """Too few tiles to fill a GPU: K in slices, each a partial product, then one sum;
    K not a multiple of the slice, batches, a bias added once (by the first slice),
    transposed operands: eager's result."""
    k = 1000
    if case == "mm":
        check(torch.mm, torch.randn(70, k), torch.randn(k, 33), atol=1e-4 * k ** 0.5)
    elif case == "bmm":
        check(torch.bmm, torch.randn(3, 20, k), torch.randn(3, k, 9), atol=1e-4 * k ** 0.5)
    elif case == "addmm":
        check(lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2.0),
              torch.randn(1, 33), torch.randn(70, k), torch.randn(k, 33), atol=2e-4 * k ** 0.5)
    else:
        check(lambda a, b: a.t() @ b.t(), torch.randn(k, 70), torch.randn(33, k), atol=1e-4 * k ** 0.5)
    names = [(d.name, d.note) for p in plans for d in p.dispatches]
    assert any(n.startswith("matmul") and "splits" in note for n, note in names), names
    assert names[-1][0].startswith("elementwise"), names


# ---------------------------------------------------------------- no split on a CPU device; K = 0
@pytest.mark.parametrize("kernel", ["tiled", "cols"])
def test_no_k_split_on_a_cpu_device(as_cpu, plans, kernel):
    """Lavapipe: shapes that split K on a GPU run as one kernel (CPU_LANES, or the
    COLS mat-vec over one K range)."""
    assert device.is_cpu()
    k = 1000
    if kernel == "tiled":
        check(torch.mm, torch.randn(70, k), torch.randn(k, 33), **tol(k))
        d, defines = only_kernel(plans, cpu_kernel())
        assert "splits" not in d.note and ("CPU_LANES" in defines) == (cpu_kernel() == "matmul:lanes")
    else:
        check(torch.mm, torch.randn(4, k), torch.randn(k, 72), **tol(k))
        d, defines = only_kernel(plans, "matvec:cols")
        assert d.groups[1] == 1 and "SPLIT_K" not in defines


@pytest.mark.parametrize("kernel,m,n", [("tiled", 20, 30), ("cols", 3, 30), ("skinny", 3, 30)])
@pytest.mark.parametrize("gpu", [False, True], ids=["cpu", "gpu"])
def test_k_zero(request, plans, kernel, m, n, gpu):
    """K = 0: the product is zeros, the output beta * bias (written by the kernel)."""
    if gpu:
        request.getfixturevalue("as_gpu")
    if kernel == "cols":
        request.getfixturevalue("cols_any_size")   # K = 0: no weight at all
    if kernel == "skinny":
        fn = lambda c, a, w: torch.addmm(c, a, w.t(), beta=0.5)   # noqa: E731
        args = (torch.randn(n), torch.randn(m, 0), torch.randn(n, 0))
    else:
        fn = lambda c, a, b: torch.addmm(c, a, b, beta=0.5)       # noqa: E731
        args = (torch.randn(n), torch.randn(m, 0), torch.randn(0, n))
    check(fn, *args)
    name = {"tiled": "matmul:", "cols": "matvec:cols", "skinny": "matvec:skinny"}[kernel]
    assert [d.name[:len(name)] for d, _ in kernels(plans)] == [name]


# ---------------------------------------------------------------- the tiled kernel, every tile
TILES = mm_lowering.GPU_TILES + (mm_lowering.SMALL_TILE,)


@pytest.fixture(params=TILES, ids=lambda t: t.name)
def tile(request, as_gpu, monkeypatch):
    """Force this tile, planned as a GPU; the device's name keeps the plans cached apart
    from other tiles' (the plan cache knows nothing of FORCE_TILE)."""
    t = request.param
    monkeypatch.setattr(mm_lowering, "FORCE_TILE", t)
    info = device.device_info()
    monkeypatch.setitem(info, "name", f"{info['name']} [{t.name}]")
    return t


@pytest.fixture
def cols_any_size(monkeypatch):
    """The COLS kernel for small weights too (below COLS_MIN_WEIGHT they take the row
    mapping); the device's name keeps these plans cached apart from the default's."""
    monkeypatch.setattr(mm_lowering, "COLS_MIN_WEIGHT", 0)
    info = device.device_info()
    monkeypatch.setitem(info, "name", f"{info['name']} [cols at any size]")


def at_offset(shape, offset):
    """A function of a flat tensor (numel(shape) + 4 elements) viewing it as `shape` from
    element `offset` on: inside the compiled graph, a strided operand at that offset."""
    numel = shape[0] * shape[1]
    return lambda f: f[offset:offset + numel].view(shape)


# case: (function, inputs, K, defines expected present, absent, K split)
def _tiled_case(case):
    if case == "odd":                     # nothing a multiple of 4 or of a tile
        m, k, n = 141, 37, 75
        return torch.mm, (torch.randn(m, k), torch.randn(k, n)), k, {"A_ALONG_K"}, \
            {"A_VEC4", "B_VEC4", "OUT_VEC4", "B_ALONG_K"}, False
    if case == "vec4":                    # aligned, partial tiles
        m, k, n = 68, 40, 72
        return torch.mm, (torch.randn(m, k), torch.randn(k, n)), k, \
            {"A_ALONG_K", "A_VEC4", "B_VEC4", "OUT_VEC4"}, {"B_ALONG_K"}, False
    if case == "offset1":                 # aligned shapes, operands at offset 1: scalar loads
        m, k, n = 68, 40, 72
        va, vb = at_offset((m, k), 1), at_offset((k, n), 1)
        return (lambda x, y: va(x) @ vb(y)), (torch.randn(m * k + 4), torch.randn(k * n + 4)), k, \
            {"A_ALONG_K", "OUT_VEC4"}, {"A_VEC4", "B_VEC4"}, False
    if case == "transposed":              # A along m, B along k, as vec4s
        m, k, n = 68, 40, 72
        return (lambda a, b: a.t() @ b.t()), (torch.randn(k, m), torch.randn(n, k)), k, \
            {"A_VEC4", "B_ALONG_K", "B_VEC4", "OUT_VEC4"}, {"A_ALONG_K"}, False
    if case == "transposed_odd":
        m, k, n = 67, 39, 73
        return (lambda a, b: a.t() @ b.t()), (torch.randn(k, m), torch.randn(n, k)), k, \
            {"B_ALONG_K"}, {"A_ALONG_K", "A_VEC4", "B_VEC4", "OUT_VEC4"}, False
    if case == "noncontig":               # A with k-stride 2; B every other row (vec4 rows)
        m, k, n = 66, 36, 40
        return (lambda a, b: a[:, ::2] @ b[::2]), (torch.randn(m, 2 * k), torch.randn(2 * k, n)), k, \
            {"A_ALONG_K", "B_VEC4", "OUT_VEC4"}, {"A_VEC4", "B_ALONG_K"}, False
    if case == "broadcast_batch":         # B's batch stride 0
        m, k, n = 33, 20, 36
        return (lambda a, b: torch.bmm(a, b.expand(3, k, n))), \
            (torch.randn(3, m, k), torch.randn(k, n)), k, {"A_VEC4", "B_VEC4"}, set(), False
    if case == "baddbmm":                 # batches, K split (torch decomposes baddbmm: bmm, then
        b, m, k, n = 2, 20, 300, 9        # an elementwise alpha * p + beta * bias)
        return (lambda c, x, y: torch.baddbmm(c, x, y, beta=0.5, alpha=2.0)), \
            (torch.randn(b, 1, n), torch.randn(b, m, k), torch.randn(b, k, n)), k, \
            {"A_VEC4"}, {"OUT_VEC4", "B_VEC4"}, True
    if case == "addmm_odd_n":             # alpha, beta, a bias per row, odd N, K split: the bias
        m, k, n = 70, 520, 75             # added once (by the first split)
        return (lambda c, x, y: torch.addmm(c, x, y, beta=0.5, alpha=2.0)), \
            (torch.randn(m, 1), torch.randn(m, k), torch.randn(k, n)), k, {"HAS_BIAS", "A_VEC4"}, \
            {"OUT_VEC4", "B_VEC4"}, True
    assert case == "k_split"              # K odd, not a multiple of the slice
    m, k, n = 70, 601, 33
    return torch.mm, (torch.randn(m, k), torch.randn(k, n)), k, set(), {"A_VEC4"}, True


TILED_CASES = ["odd", "vec4", "offset1", "transposed", "transposed_odd", "noncontig",
               "broadcast_batch", "baddbmm", "addmm_odd_n", "k_split"]


@pytest.mark.parametrize("case", TILED_CASES)
def test_tiled(tile, plans, case):
    fn, args, k, present, absent, split = _tiled_case(case)
    check(fn, *args, **tol(k, 2.0))
    ks = kernels(plans)
    (d, defines), rest = ks[0], ks[1:]
    assert d.name == "matmul:" + tile.name, [x.name for x, _ in ks]
    assert {name: int(defines[name]) for name in tile.defines()} == tile.defines()
    assert present <= defines.keys() and not absent & defines.keys(), defines
    if case == "offset1":
        assert d.spec[3] == 1 and d.spec[7] == 1       # A_OFF, B_OFF
    if case == "broadcast_batch":
        assert d.spec[8] == 0 and d.groups[2] == 3     # B_SB
    if split:
        splits = d.spec[18]
        assert splits > 1 and "splits" in d.note and d.groups[2] == splits * d.spec[19]
        assert (splits - 1) * d.spec[17] < k <= splits * d.spec[17]
        assert rest and all(x.name.startswith("elementwise") for x, _ in rest), [x.name for x, _ in rest]
        assert len(rest) == 1 + (case == "baddbmm")    # the splits' sum (and baddbmm's epilogue)
    else:
        assert len(d.spec) == 17 and not rest


# ---------------------------------------------------------------- the tile choice
GPU_CAPS = {"device_type": GPU, "max_compute_shared_memory_size": 49152,
            "max_compute_work_group_invocations": 1024, "max_storage_buffer_range": (1 << 32) - 1}
T128, T128x64, T64 = mm_lowering.GPU_TILES


@pytest.mark.parametrize("nb,m,n,k,want,splits", [
    (1, 4096, 4096, 4096, T128, 1),      # enough 128x128 tiles
    (1, 2048, 2048, 16, T128, 1),        # exactly SPLIT_K_WGS of them
    (1, 1024, 1024, 1024, T128, 4),      # 64 tiles, K split 4 ways reaches 256
    (1, 1024, 2048, 128, T128x64, 1),    # K too short to split: the 128x64 tile reaches 256
    (1, 1024, 1024, 128, T64, 1),        # ... only the 64x64 one does
    (1, 512, 512, 256, T64, 2),          # none reaches: the most workgroups
    (8, 128, 128, 64, T64, 1),           # batches count
    (1, 64, 64, 100000, T128, 8),        # a tie (one tile each, MAX_K_SPLITS): the largest
], ids=lambda v: v.name if isinstance(v, mm_lowering.Tile) else None)
def test_choose_tile_on_a_gpu(nb, m, n, k, want, splits):
    t, s, ks = mm_lowering.choose_tile(GPU_CAPS, nb, m, n, k)
    assert (t, s) == (want, splits)
    assert (s - 1) * ks < k <= s * ks and (s == 1 or ks % 16 == 0)


MIN_LIMITS = {"max_compute_shared_memory_size": 16384, "max_compute_work_group_invocations": 128}


@pytest.mark.parametrize("limits,force,want", [
    # 128x128x8 and 64x64x16 need more than 16 KiB
    pytest.param(MIN_LIMITS | {"max_compute_work_group_invocations": 256}, None, T128x64, id="16KiB"),
    # Vulkan's minimums: 256 threads are too many
    pytest.param(MIN_LIMITS, None, mm_lowering.SMALL_TILE, id="minimums"),
    pytest.param(MIN_LIMITS, T128, mm_lowering.SMALL_TILE, id="forced-too-large"),
    pytest.param({}, T64, T64, id="forced"),
    pytest.param({"max_compute_shared_memory_size": 4096}, None, None, id="none-fits"),
])
def test_choose_tile_limits(monkeypatch, limits, force, want):
    """4096^3 (enough tiles of any size, no K split) on a device of these limits."""
    monkeypatch.setattr(mm_lowering, "FORCE_TILE", force)
    caps = GPU_CAPS | limits
    if want is None:
        with pytest.raises(LoweringError, match="no matmul tile fits"):
            mm_lowering.choose_tile(caps, 1, 4096, 4096, 4096)
        return
    assert mm_lowering.choose_tile(caps, 1, 4096, 4096, 4096) == (want, 1, 4096)
    assert want.shared_bytes <= caps["max_compute_shared_memory_size"]
    assert want.threads <= caps["max_compute_work_group_invocations"]


def test_choose_tile_partials_fit_one_buffer():
    """K splits are capped by the partial products' buffer (splits x M x N floats)."""
    m, n, k = 70, 33, 1000
    assert mm_lowering.choose_tile(GPU_CAPS, 1, m, n, k)[:2] == (T64, 7)
    t, s, ks = mm_lowering.choose_tile(GPU_CAPS | {"max_storage_buffer_range": 4 * m * n * 2}, 1, m, n, k)
    assert (t, s, ks) == (T64, 2, 512)


@pytest.mark.parametrize("case", ["k_tail", "k_under_8", "b_along_n", "a_transposed", "batched",
                                  "addmm_scaled", "k_multiple_of_4"])
def test_cpu_lanes(as_cpu, plans, case):
    """CPU_LANES (a CPU device's matmul) against eager: K not a multiple of 8 (the last
    step's tail zeroed, also on the 16-byte path), K below 8, B along n (scalar loads),
    A transposed, batches, a broadcast bias with alpha and beta; rows and columns past
    the workgroup's (clamped, not stored)."""
    g = torch.Generator().manual_seed(11)
    r = lambda *s: torch.randn(*s, generator=g)   # noqa: E731
    if case == "k_tail":
        fn, args, k = torch.nn.functional.linear, (r(19, 29), r(70, 29)), 29
    elif case == "k_under_8":
        fn, args, k = torch.mm, (r(21, 5), r(5, 13)), 5
    elif case == "b_along_n":
        fn, args, k = torch.mm, (r(17, 40), r(40, 101)), 40
    elif case == "a_transposed":
        fn, args, k = (lambda a, b: a.t() @ b), (r(36, 20), r(36, 50)), 36
    elif case == "batched":
        fn, args, k = torch.bmm, (r(3, 19, 24), r(3, 24, 9)), 24
    elif case == "addmm_scaled":
        fn, args, k = (lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2.0)), (r(1, 30), r(18, 64), r(64, 30)), 64
    else:
        fn, args, k = torch.nn.functional.linear, (r(17, 44), r(600, 44)), 44
    check(fn, *args, **tol(k))
    d, defines = only_kernel(plans, cpu_kernel())
    lanes = cpu_kernel() == "matmul:lanes"       # else subgroups of 4: the tiled kernel
    assert ("CPU_LANES" in defines) == lanes
    if lanes and case in ("k_tail", "k_multiple_of_4"):
        assert ("B_VEC4" in defines) == (case == "k_multiple_of_4")


@pytest.mark.parametrize("caps", ["lavapipe", "cpu_type"])
def test_choose_tile_on_a_cpu_device(caps):
    """CPU devices with subgroups under 8 lanes (no CPU_LANES): CPU_TILE, K never split,
    whatever the shape."""
    info = device.device_info() if caps == "lavapipe" else \
        GPU_CAPS | {"device_type": "PHYSICAL_DEVICE_TYPE_CPU"}
    for nb, m, n, k in [(1, 70, 33, 1000), (1, 4096, 4096, 4096), (1, 64, 64, 100000)]:
        assert mm_lowering.choose_tile(info, nb, m, n, k) == (mm_lowering.CPU_TILE, 1, k)


# ---------------------------------------------------------------- COLS: B along n, few rows
def _three_calls(fn, make, k, plans, scale=1.0):
    """fn compiled once, called on three sets of inputs (fresh values: a split whose
    counter were not reset would leave the previous call's output): eager's each time."""
    f = compiled(fn)
    for _ in range(3):
        args = make()
        torch.testing.assert_close(f(*args), fn(*args), **tol(k, scale))
    assert len(plans) == 1


def _cols_checks(plans, nb, m, n, k):
    d, defines = only_kernel(plans, "matvec:cols")
    p = mm_lowering.cols_params(device.device_info(), nb, m, n, k)
    assert int(defines["MROWS"]) == m
    assert (int(defines["CQ"]), int(defines["KT"])) == (p["CQ"], p["KT"])
    assert d.groups == (p["blocks"], p["splits"], nb)
    assert ("SPLIT_K" in defines) == (p["splits"] > 1)
    assert d.spec[0] == p["CQ"] * p["KT"] and d.spec[-3:] == [p["ks"], p["splits"], nb]
    return d, defines, p


COLS_SHAPES = [  # (m, k, n, K split across workgroups on a GPU)
    (1, 64, 32, False),
    (1, 7, 1000, False),       # short K: one k slice
    (1, 1000, 64, True),       # K not a multiple of its slice
    (4, 512, 256, True),
    (3, 300, 37, False),       # N % 4 != 0
    (3, 1500, 37, True),       # ... split
    (2, 1001, 1030, True),     # ... K odd, several column blocks
    (8, 257, 130, False),
    (12, 2000, 100, True),     # partial sums meet MC rows at a time
    (16, 1500, 64, True),
    (5, 4096, 8, True),        # one column block, long K
    (9, 3, 5, False),          # K < 4
]


@pytest.mark.parametrize("m,k,n,split", COLS_SHAPES, ids=str)
def test_cols(as_gpu, cols_any_size, plans, m, k, n, split):
    _three_calls(torch.mm, lambda: (torch.randn(m, k), torch.randn(k, n)), k, plans)
    d, defines, p = _cols_checks(plans, 1, m, n, k)
    assert (p["splits"] > 1) == split
    assert ("B_VEC4" in defines) == (n % 4 == 0)
    assert ("A_VEC4" in defines) == (k % 4 == 0 or m == 1)


@pytest.mark.parametrize("layout", ["bias_n", "bias_mn", "bmm", "broadcast_batch", "a_offset",
                                    "b_offset", "a_transposed", "b_col_stride2"])
def test_cols_layouts(as_gpu, cols_any_size, plans, layout):
    """The COLS kernel with K split, on operands read through their strides; a bias
    added once, after the splits' sum."""
    nb, m, k, n = 1, 3, 1000, 64
    present, absent = {"A_VEC4", "B_VEC4"}, set()
    if layout in ("bias_n", "bias_mn"):
        c_shape = (n,) if layout == "bias_n" else (m, n)
        fn = lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2.0)   # noqa: E731
        make = lambda: (torch.randn(c_shape), torch.randn(m, k), torch.randn(k, n))   # noqa: E731
        present = present | {"HAS_BIAS"}
    elif layout == "bmm":
        nb = 3
        fn, make = torch.bmm, lambda: (torch.randn(nb, m, k), torch.randn(nb, k, n))
    elif layout == "broadcast_batch":
        nb, k = 3, 1200
        fn = lambda a, b: torch.bmm(a, b.expand(nb, k, n))   # noqa: E731
        make = lambda: (torch.randn(nb, m, k), torch.randn(k, n))   # noqa: E731
    elif layout in ("a_offset", "b_offset"):
        m = 4
        va = at_offset((m, k), 1 if layout == "a_offset" else 0)
        vb = at_offset((k, n), 1 if layout == "b_offset" else 0)
        fn = lambda x, y: va(x) @ vb(y)   # noqa: E731
        make = lambda: (torch.randn(m * k + 4), torch.randn(k * n + 4))   # noqa: E731
        scalar = "A_VEC4" if layout == "a_offset" else "B_VEC4"     # the operand at offset 1
        present, absent = present - {scalar}, {scalar}
    elif layout == "a_transposed":
        fn = lambda at, b: at.t() @ b   # noqa: E731
        make = lambda: (torch.randn(k, m), torch.randn(k, n))   # noqa: E731
        present, absent = {"B_VEC4"}, {"A_VEC4"}
    else:
        fn = lambda a, b: a @ b[:, ::2]   # noqa: E731
        make = lambda: (torch.randn(m, k), torch.randn(k, 2 * n))   # noqa: E731
        present, absent = {"A_VEC4"}, {"B_VEC4"}
    _three_calls(fn, make, k, plans, 2.0)
    d, defines, p = _cols_checks(plans, nb, m, n, k)
    assert p["splits"] > 1
    assert present <= defines.keys() and not absent & defines.keys(), defines
    spec = d.spec[1:]              # spec[0]: the workgroup size
    if layout == "broadcast_batch":
        assert spec[8] == 0        # B_SB
    if layout in ("a_offset", "b_offset"):
        assert (spec[3], spec[7]) == ((1, 0) if layout == "a_offset" else (0, 1))
    if layout == "a_transposed":
        assert (spec[5], spec[6]) == (1, m)       # A_SM, A_SK
    if layout == "b_col_stride2":
        assert (spec[9], spec[10]) == (2 * n, 2)  # B_SK, B_SN


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu", "gpu"])
def test_cols_tiny_one_workgroup(request, plans, gpu):
    """x[1, 16] @ W[16, 16] in the COLS kernel: one workgroup of 4 threads, one k slice
    (no shared memory, no barrier), no K split on either device."""
    if gpu:
        request.getfixturevalue("as_gpu")
    request.getfixturevalue("cols_any_size")
    _three_calls(torch.mm, lambda: (torch.randn(1, 16), torch.randn(16, 16)), 16, plans)
    d, defines = only_kernel(plans, "matvec:cols")
    assert d.groups == (1, 1, 1) and d.spec[0] == 4
    assert defines == {"VARIANT": "cols", "COLS": "1", "MROWS": "1", "CQ": "4", "KT": "1",
                       "UNROLL": "4", "MC": "1", "A_VEC4": "1", "B_VEC4": "1"}


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu", "gpu"])
@pytest.mark.parametrize("m,k,n,kernel", [(1, 16, 16, "matvec:skinny"), (8, 100, 200, "matvec:skinny"),
                                          (1, 256, 256, "matvec:cols"), (12, 16, 16, "matvec:cols")])
def test_small_weights_take_the_row_mapping(request, plans, gpu, m, k, n, kernel):
    """x @ W with W [K, N] row-major: below COLS_MIN_WEIGHT elements and up to SKINNY_M
    rows, one workgroup per column (shorter than COLS there); COLS from that size, or for
    more rows than the row mapping takes."""
    if gpu:
        request.getfixturevalue("as_gpu")
    check(torch.mm, torch.randn(m, k), torch.randn(k, n), **tol(k))
    only_kernel(plans, kernel)


# ---------------------------------------------------------------- skinny: B along k (nn.Linear)
@pytest.mark.parametrize("m,k,n,case", [
    (1, 5, 7, "linear"),        # K below the subgroup size: one subgroup
    (3, 8, 16, "bias"),         # K = the subgroup size (lavapipe: 8)
    (5, 33, 40, "linear"),
    (8, 300, 17, "bias"),       # several subgroups meet in shared memory; MROWS 8
    (2, 70, 9, "bmm"),
])
@pytest.mark.parametrize("gpu", [False, True], ids=["cpu", "gpu"])
def test_skinny_along_k(request, plans, m, k, n, case, gpu):
    if gpu:
        request.getfixturevalue("as_gpu")
    nb = 1
    if case == "linear":
        check(F.linear, torch.randn(m, k), torch.randn(n, k), **tol(k))
    elif case == "bias":
        check(F.linear, torch.randn(m, k), torch.randn(n, k), torch.randn(n), **tol(k))
    else:
        nb = 3
        check(lambda x, w: torch.bmm(x, w.transpose(1, 2)), torch.randn(nb, m, k),
              torch.randn(nb, n, k), **tol(k))
    d, defines = only_kernel(plans, "matvec:skinny")
    sg, wg = device.device_info()["subgroup_size"], d.spec[0]
    # one subgroup where it holds K and a thread per row of A, else the next power of 2
    wide = 1 << (max(k, m) - 1).bit_length()
    assert wg == (sg if wide <= sg else min(wide, mm_lowering.MV_WG)) and wg >= m
    assert int(defines["MROWS"]) == m and d.groups == (n, 1, nb)
    assert ("HAS_BIAS" in defines) == (case == "bias")


def test_cpu_device_runs_prompt_products_on_the_host(as_cpu, monkeypatch):
    """On a CPU Vulkan device with DYNAMO_VULKAN_CPU_MATMUL at its default (host), products
    of HOST_MATMUL_MIN_ROWS rows or more (mm, bmm, addmm, a prompt's gguf_linear, a
    convolution's output positions) run through torch, and the rest of their graph with
    them, as placements: no fallback
    warning, allowed under DYNAMO_VULKAN_FALLBACK=error; fewer rows, and every product with
    DYNAMO_VULKAN_CPU_MATMUL=vulkan, stay on Vulkan; a bad value is an error that names
    the variable."""
    import warnings

    import dynamo_vulkan
    from dynamo_vulkan.gguf.op import GGUFLinear
    from dynamo_vulkan.partition import HostPlacement

    monkeypatch.setenv("DYNAMO_VULKAN_CPU_MATMUL", "host")
    monkeypatch.setenv("DYNAMO_VULKAN_FALLBACK", "error")
    lin = GGUFLinear.from_float(torch.randn(24, 64) * 0.1, "Q8_0")

    def f(a, b, c, x, s):
        return (torch.relu(a @ b) @ b.t(), torch.bmm(c, c.transpose(1, 2)).softmax(-1), lin(x),
                F.conv1d(s, torch.ones(5, 4, 1)))      # a product over s's positions

    def ops_on(where, reps):      # the products that ran there
        return sorted(n.op for r in reps for n in r.nodes if n.where == where and n.op.startswith(
            ("aten.mm", "aten.bmm", "aten.addmm", "aten.convolution", "dynamo_vulkan.gguf")))
    from dynamo_vulkan.lowering.core import HOST_MATMUL_MIN_ROWS as least
    for rows, where in ((least, "cpu"), (least - 1, "vulkan")):
        torch._dynamo.reset()
        args = (torch.randn(rows, 64), torch.randn(64, 32), torch.randn(2, rows, 16), torch.randn(rows, 64),
                torch.randn(1, 4, rows))
        n = len(dynamo_vulkan.reports())
        with warnings.catch_warnings():
            warnings.simplefilter("error")       # a placement warns of nothing
            got = torch.compile(f, backend="vulkan")(*args)
        for g, e in zip(got, f(*args)):
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)
        reps = dynamo_vulkan.reports()[n:]
        placed = [n for r in reps for n in r.cpu_nodes]
        assert ops_on(where, reps) and not ops_on("cpu" if where == "vulkan" else "vulkan", reps)
        assert all(isinstance(p.reason, HostPlacement) and "DYNAMO_VULKAN_CPU_MATMUL" in p.reason
                   for p in placed)
        assert bool(placed) == (where == "cpu")
        assert not [n for r in reps for n in r.vulkan_nodes] if where == "cpu" else not placed
    torch._dynamo.reset()           # a convolution on its own: placed by its own rule
    n = len(dynamo_vulkan.reports())
    torch.compile(lambda s: F.conv1d(s, torch.ones(5, 4, 1)), backend="vulkan")(torch.randn(1, 4, least))
    convs = [d for r in dynamo_vulkan.reports()[n:] for d in r.nodes if d.op.startswith("aten.convolution")]
    assert convs and all(d.where == "cpu" and isinstance(d.reason, HostPlacement) for d in convs)
    monkeypatch.setenv("DYNAMO_VULKAN_CPU_MATMUL", "vulkan")
    torch._dynamo.reset()
    check(lambda a, b: a @ b, torch.randn(9, 64), torch.randn(64, 32))
    monkeypatch.setenv("DYNAMO_VULKAN_CPU_MATMUL", "blas")
    torch._dynamo.reset()
    with pytest.raises(Exception, match="DYNAMO_VULKAN_CPU_MATMUL='blas'"):
        torch.compile(lambda a, b: a @ b, backend="vulkan")(torch.randn(9, 64), torch.randn(64, 32))
