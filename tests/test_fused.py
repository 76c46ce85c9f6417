"""Fused building blocks (dynamo_vulkan/fused.py, lowering/attention.py, the RMS_NORM
row kernel, apply_rope's elementwise form): each matches eager and is one kernel."""
import math

import pytest
import torch

from dynamo_vulkan import device
from dynamo_vulkan.fused import attention, rms_norm
from dynamo_vulkan.lowering import attention as att_lowering
from dynamo_vulkan.llm.models.decoder import apply_rope, pair_tables
from vk import check, noncontig

torch.manual_seed(0)


def _names(plans):
    return [d.name for p in plans for d in p.dispatches]


@pytest.mark.parametrize("shape", [(5, 576), (2, 3, 7), (1, 1), (4, 1), (3, 1000)], ids=str)
def test_rms_norm(plans, shape):
    x, w = torch.randn(shape) * 3, torch.randn(shape[-1])
    check(lambda x, w: rms_norm(x, w, 1e-6), x, w)
    assert _names(plans) == ["rowwise:rms_norm"]


def test_rms_norm_noncontiguous_inputs():
    x = torch.randn(6, 4, 10).transpose(0, 1)          # rows of 10, strided row index
    check(lambda x, w: rms_norm(x, w, 1e-5), x, noncontig(torch.randn(10)))


@pytest.mark.parametrize("order", ["x + norm", "norm + x"])
def test_rms_norm_adds_the_residual(plans, order):
    """A post-norm's residual add (Gemma 3) runs in the norm's kernel."""
    x, h, w = torch.randn(3, 640), torch.randn(3, 640), torch.randn(640)
    if order == "x + norm":
        check(lambda x, h, w: x + rms_norm(h, w, 1e-6), x, h, w)
    else:
        check(lambda x, h, w: rms_norm(h, w, 1e-6) + x, x, h, w)
    assert _names(plans) == ["rowwise:rms_norm"]


def test_rms_norm_residual_of_another_layout_is_added_apart(plans):
    """A residual that is a transposed view in the graph: the add keeps its own kernel."""
    check(lambda x, h, w: x.t() + rms_norm(h, w, 1e-6), torch.randn(10, 3), torch.randn(3, 10),
          torch.randn(10))
    assert sorted(_names(plans)) == ["elementwise:2in2d", "rowwise:rms_norm"]


def _reference_attention(q, k, v, mask, scale):
    """Written independently of the op: repeat kv heads, mask, softmax, weigh."""
    g = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(g, 0), v.repeat_interleave(g, 0)
    s = (q @ k.transpose(1, 2)) * scale
    return torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ v


def _causal(t, c, start):
    return (start + torch.arange(t))[:, None] >= torch.arange(c)[None, :]


# (query heads, kv heads, query rows, keys, head dim, value dim): GQA, one row (decode),
# several chunks of keys (256 a chunk on GPUs, 32 on lavapipe), odd sizes, value dims
# past one chunk of invocations
CASES = [(9, 3, 1, 256, 64, 64), (4, 4, 5, 7, 8, 8), (8, 2, 3, 600, 256, 256), (9, 3, 1, 1100, 64, 64),
         (2, 1, 1, 1, 3, 5), (6, 3, 4, 530, 80, 80), (2, 2, 2, 9, 16, 300),
         (4, 1, 1, 3000, 256, 256), (16, 4, 8, 100, 12, 12), (66, 66, 1, 64, 8, 8),
         # split decode rows loading V early in scalars (odd dims), and one with too many
         # V rows per invocation to hold them in registers
         (3, 1, 1, 200, 7, 9), (2, 2, 1, 500, 16, 300)]


@pytest.mark.parametrize("hq,hkv,t,c,d,dv", CASES, ids=str)
def test_attention(plans, hq, hkv, t, c, d, dv):
    _check_attention(plans, hq, hkv, t, c, d, dv)


@pytest.mark.parametrize("hq,hkv,t,c,d,dv", CASES, ids=str)
def test_attention_as_gpu(as_gpu, plans, hq, hkv, t, c, d, dv):
    """The GPU's workgroups (256 keys a chunk; lavapipe's hold 32), on this device."""
    _check_attention(plans, hq, hkv, t, c, d, dv)


def _check_attention(plans, hq, hkv, t, c, d, dv):
    q, k, v = torch.randn(hq, t, d), torch.randn(hkv, c, d), torch.randn(hkv, c, dv)
    mask = _causal(t, c, (c - t) // 2)
    scale = 1 / math.sqrt(d)
    torch.testing.assert_close(attention(q, k, v, mask, scale),
                               _reference_attention(q, k, v, mask, scale), rtol=1e-5, atol=1e-5)
    check(lambda q, k, v, m: attention(q, k, v, m, scale), q, k, v, mask)
    # few query rows over many keys (decode): the keys are split, and the last split of
    # each row merges them in the same kernel
    # (splits_keys: more than one chunk of keys, the device's workgroup over the
    # invocations per key; on a GPU only)
    info = device.device_info()
    tpk = att_lowering.split_invocations_per_key(d // (4 if d % 4 == 0 and dv % 4 == 0 else 1))
    split = att_lowering.splits_keys(info, hq * t, c, att_lowering.workgroup_size(info), tpk)
    lanes = att_lowering.cpu_lanes(info, t) and d % 4 == 0 and dv % 4 == 0   # a prompt, CPU device
    # split keys take each mask row's live range from mask_ranges.comp
    assert _names(plans) == ["attention:lanes" if lanes else "attention"] if not split else \
        ["mask_ranges", "attention"]
    assert ("splits merged by the last" in plans[-1].dispatches[-1].note) == split


# prompts (16 rows or more) on a GPU: the register-tiled kernel; rows past a block, keys
# past a chunk, GQA, odd dims (rows padded to vec4s), a value dim past the invocations of a
# row group, Gemma 3's head dim of 256
TILED = [(4, 2, 40, 70, 64, 64), (7, 1, 17, 300, 128, 128), (2, 2, 33, 33, 5, 300), (3, 3, 16, 16, 16, 24),
         (4, 1, 37, 90, 256, 256)]


@pytest.mark.parametrize("hq,hkv,t,c,d,dv", TILED, ids=str)
@pytest.mark.parametrize("softcap", [0.0, 2.5])
def test_tiled_attention_as_gpu(as_gpu, plans, monkeypatch, hq, hkv, t, c, d, dv, softcap):
    """A prompt's attention tiled (attention_tiled.comp) against eager: causal, the
    soft-cap, and a mask with windows, holes and a row with no live key (NaN). (Any
    number of workgroups here: TILED_MIN_BLOCKS lowered.)"""
    monkeypatch.setattr(att_lowering, "TILED_MIN_BLOCKS", 1)
    g = torch.Generator().manual_seed(t + c + d)
    q, k, v = torch.randn(hq, t, d, generator=g), torch.randn(hkv, c, d, generator=g), \
        torch.randn(hkv, c, dv, generator=g)
    holes = (torch.rand(t, c, generator=g) > 0.3) & _causal(t, c, c - t)
    holes[1, :] = False
    for mask in (_causal(t, c, c - t), holes):
        torch._dynamo.reset()                            # the same code: compiled again
        check(lambda q, k, v, m: attention(q, k, v, m, 0.2, softcap), q, k, v, mask, rtol=1e-5, atol=1e-5)
    assert _names(plans) == ["mask_ranges", "attention_tiled"] * 2
    assert "tiled" in plans[-1].dispatches[-1].note


@pytest.mark.parametrize("config", att_lowering.TILED_CONFIGS, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_each_tiled_config(as_gpu, plans, monkeypatch, config, layout):
    """Every tile of TILED_CONFIGS that fits this device, with K and V in shared arrays
    of their own and in one, on vec4 rows (q a view of [t, heads, d], the mask a window
    of a longer cache's) and on strided ones (scalar loads), against eager."""
    monkeypatch.setattr(att_lowering, "TILED_MIN_BLOCKS", 1)
    monkeypatch.setattr(att_lowering, "TILED_CONFIGS", (config,))
    hq, hkv, t, c, d = 6, 2, 45, 100, 32
    g = torch.Generator().manual_seed(sum(config))
    if layout == "contiguous":
        q = torch.randn(t, hq, d, generator=g).transpose(0, 1)
        k, v = torch.randn(hkv, c, d, generator=g), torch.randn(hkv, c, d, generator=g)
        mask = _causal(t, c + 8, c - t)[:, 4:c + 4]
    else:
        q = torch.randn(hq, t, d + 1, generator=g)[..., 1:]
        k = torch.randn(hkv, d, c, generator=g).transpose(1, 2)
        v = torch.randn(hkv, c, d + 3, generator=g)[..., :d]
        mask = _causal(c, t, 0).t()
    real = att_lowering._tiled_shared
    for apart in (True, False):
        # each tile fits lavapipe's 32 KiB both ways at these dims; the other layout is
        # made not to fit
        assert real(config[0], config[1], config[3], d, d, apart) <= device.device_info()["max_compute_shared_memory_size"]
        monkeypatch.setattr(att_lowering, "_tiled_shared",
                            lambda *a, _apart=apart: real(*a) if a[-1] == _apart else 1 << 30)
        torch._dynamo.reset()
        tile = att_lowering.tiled_config(device.device_info(), hq, t, d, d)
        assert tile is not None and tile.kv_apart == apart
        check(lambda q, k, v, m: attention(q, k, v, m, 0.3), q, k, v, mask, rtol=1e-5, atol=1e-5)
        assert _names(plans)[-1] == "attention_tiled"


def test_tiled_attentions_share_their_mask_ranges(as_gpu, plans, monkeypatch):
    """Two attentions over one mask (two layers) take its live ranges from one
    mask_ranges dispatch."""
    monkeypatch.setattr(att_lowering, "TILED_MIN_BLOCKS", 1)
    q, k, v = torch.randn(4, 20, 16), torch.randn(2, 30, 16), torch.randn(2, 30, 16)

    def two_layers(q, k, v, m):
        return attention(attention(q, k, v, m, 0.25) + q, k, v, m, 0.25)

    check(two_layers, q, k, v, _causal(20, 30, 10), rtol=1e-5, atol=1e-5)
    names = [n for n in _names(plans) if not n.startswith("elementwise")]
    assert names == ["mask_ranges", "attention_tiled", "attention_tiled"]


def test_derived_values_are_made_again_after_a_write():
    """Context.derived (a mask's ranges, x's int8 planes) hands back what it made until a
    dispatch writes a buffer it was derived from."""
    from dynamo_vulkan.lowering.core import Context
    ctx = Context(device.device_info())
    src, other = ctx.empty((8,), "f32"), ctx.empty((8,), "f32")
    made = []

    def make():
        made.append(ctx.empty((8,), "f32"))
        ctx.dispatch("accumulate", {"VARIANT": "x"}, [made[-1], src], [0], [], (1, 1, 1))
        return made[-1]

    first = ctx.derived("key", {src.buf}, make)
    ctx.dispatch("accumulate", {"VARIANT": "y"}, [other, src], [0], [], (1, 1, 1))   # writes other
    assert ctx.derived("key", {src.buf}, make) is first and len(made) == 1
    ctx.dispatch("accumulate", {"VARIANT": "z"}, [src, other], [0], [], (1, 1, 1))   # writes src
    assert ctx.derived("key", {src.buf}, make) is not first and len(made) == 2


def test_when_attention_is_tiled():
    """On a GPU, prompts of TILED_MIN_ROWS rows in TILED_MIN_BLOCKS workgroups or more,
    by the first tile that fits the shared memory and the registers; never on a CPU
    device."""
    gpu = {"device_type": "PHYSICAL_DEVICE_TYPE_DISCRETE_GPU",
           "max_compute_shared_memory_size": 49152, "max_compute_work_group_invocations": 1024}
    tile = att_lowering.tiled_config
    seven_b = tile(gpu, 28, 512, 128, 128)
    assert (seven_b.bq, seven_b.rpt, seven_b.tprg, seven_b.kv_apart) == (32, 2, 16, False)
    assert seven_b.wg == 256
    assert tile(gpu, 28, 128, 128, 128).bq == 32
    assert tile(gpu, 9, 512, 64, 64).kv_apart                    # SmolLM2: K and V apart
    assert tile(gpu, 9, 128, 64, 64).bq == 16                    # 72 blocks of 16 rows, not 36 of 32
    assert tile(gpu, 2, 128, 64, 64) is None                     # 32 blocks at most: the row kernel
    assert tile(gpu, 28, 8, 128, 128) is None                    # decode-sized
    gemma = tile(gpu, 4, 512, 256, 256)                          # q tiles of 16 rows do not fit
    assert (gemma.bq, gemma.bk, gemma.rpt, gemma.tprg) == (8, 32, 1, 32)
    assert tile(gpu, 4, 128, 256, 256).bq == 8                   # 64 blocks of 8 rows
    small = tile(dict(gpu, max_compute_shared_memory_size=32768), 28, 512, 128, 128)
    assert small.bq == 16 and att_lowering._tiled_shared(small.bq, small.bk, small.tprg, 128, 128,
                                                          small.kv_apart) <= 32768
    assert tile(gpu, 28, 512, 1024, 1024) is None                # no tile fits
    assert tile(dict(gpu, device_type="PHYSICAL_DEVICE_TYPE_CPU"), 28, 512, 128, 128) is None


@pytest.mark.parametrize("plan_as", ["device", "as_gpu"])
@pytest.mark.parametrize("t,c", [(1, 700), (1, 40), (5, 300)], ids=str)
def test_attention_masks_with_windows_and_holes(request, plan_as, t, c):
    """Masks that are not causal: a sliding window (no live key before it), holes inside
    it, and a row with no live key at all (NaN, as eager's softmax gives). Each workgroup
    first finds its keys' live range in the mask, planned for lavapipe or as a GPU."""
    if plan_as != "device":
        request.getfixturevalue(plan_as)
    g = torch.Generator().manual_seed(c + t)
    q, k, v = torch.randn(9, t, 64, generator=g), torch.randn(3, c, 64, generator=g), \
        torch.randn(3, c, 64, generator=g)
    keys = torch.arange(c)[None, :]
    start = torch.randint(0, c - 20, (t, 1), generator=g)
    mask = (keys >= start) & (keys < start + 17) & (torch.rand(t, c, generator=g) > 0.3)
    mask[:, -1] = False
    if t > 1:
        mask[0, :] = False                               # a prompt row with no live key
    check(lambda q, k, v, m: attention(q, k, v, m, 0.125), q, k, v, mask, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lo,hi", [(0, 2048), (37, 2900), (2990, 2999)], ids=str)
def test_decode_splits_share_the_live_keys(as_gpu, plans, lo, hi):
    """Decode's splits take even shares of the row's live interval (mask_ranges), in whole
    chunks: keys from lo to hi of a 3,000-slot cache with holes in between, so a split
    walks up to two chunks, or all the keys sit in the first split's one chunk; eager's
    output, and the ranges kernel is the plan's first."""
    hq, hkv, c, d = 4, 1, 3000, 64
    g = torch.Generator().manual_seed(hi)
    q, k, v = torch.randn(hq, 1, d, generator=g), torch.randn(hkv, c, d, generator=g), \
        torch.randn(hkv, c, d, generator=g)
    keys = torch.arange(c)[None, :]
    mask = (keys >= lo) & (keys < hi) & (torch.rand(1, c, generator=g) > 0.3)
    mask[0, lo] = mask[0, hi - 1] = True
    check(lambda q, k, v, m: attention(q, k, v, m, 0.125), q, k, v, mask, rtol=1e-5, atol=1e-5)
    assert _names(plans) == ["mask_ranges", "attention"]
    assert "47 splits merged by the last" in plans[-1].dispatches[-1].note


def test_split_attention_called_again(as_gpu, plans):
    """The row counters are reset by the kernel, so a second call (new q, same program)
    merges right, in the one kernel whose last split merges (planned as a GPU: lavapipe
    keeps a workgroup per row)."""
    hq, hkv, c, d = 9, 3, 300, 64
    k, v = torch.randn(hkv, c, d), torch.randn(hkv, c, d)
    mask = _causal(1, c, 250)
    fn = torch.compile(lambda q, k, v, m: attention(q, k, v, m, 0.125), backend="vulkan", dynamic=False)
    for _ in range(3):
        q = torch.randn(hq, 1, d)
        torch.testing.assert_close(fn(q, k, v, mask), attention(q, k, v, mask, 0.125), rtol=1e-5, atol=1e-5)
    assert _names(plans)[-1:] == ["attention"] and "merged by the last" in plans[-1].dispatches[-1].note


@pytest.mark.parametrize("hq,hkv,d,splits", [(28, 4, 128, 32), (9, 3, 64, 64), (4, 1, 256, 64)], ids=str)
def test_decode_splits_follow_the_heads(as_gpu, plans, hq, hkv, d, splits):
    """A decode step over a 2048-slot cache keeps within SPLIT_WORKGROUPS workgroups: a
    7B's 28 heads take 32 key splits, SmolLM2's 9 and Gemma 3's 4 take 64 (MAX_SPLITS);
    the output is eager's either way."""
    c = 2048
    q, k, v = torch.randn(hq, 1, d), torch.randn(hkv, c, d), torch.randn(hkv, c, d)
    mask = _causal(1, c, 700)
    check(lambda q, k, v, m: attention(q, k, v, m, 0.1), q, k, v, mask, rtol=1e-5, atol=1e-5)
    note = plans[-1].dispatches[-1].note
    assert f", {splits} splits merged by the last" in note, note
    assert hq * splits <= att_lowering.SPLIT_WORKGROUPS or splits == 1


def test_attention_strided_inputs_and_sliding_window():
    q = torch.randn(3, 6, 32).transpose(0, 1)           # [6 heads, 3 rows, 32], strided
    k, v = noncontig(torch.randn(2, 300, 32)), torch.randn(300, 2, 16).transpose(0, 1)
    rel = (290 + torch.arange(3))[:, None] - torch.arange(300)[None, :]
    mask = (rel >= 0) & (rel < 20)                       # a 20-key window near the end
    check(lambda q, k, v, m: attention(q, k, v, m, 0.3), q, k, v, mask)


@pytest.mark.parametrize("c", [5, 1500], ids=["one chunk", "split keys"])
def test_attention_row_with_nothing_to_attend_is_nan(c):
    q, k, v = torch.randn(2, 2, 8), torch.randn(1, c, 8), torch.randn(1, c, 8)
    mask = torch.zeros(2, c, dtype=torch.bool)
    mask[0, [0, 2, c - 1]] = True
    got = check(lambda q, k, v, m: attention(q, k, v, m, 1.0), q, k, v, mask)
    assert torch.isnan(got[:, 1]).all() and not torch.isnan(got[:, 0]).any()


def test_attention_rejects_a_bad_mask():
    q, k, v = torch.randn(2, 3, 8), torch.randn(1, 5, 8), torch.randn(1, 5, 8)
    with pytest.raises(RuntimeError, match="mask must be bool"):
        attention(q, k, v, torch.ones(3, 4, dtype=torch.bool), 1.0)
    with pytest.raises(RuntimeError, match="query heads"):
        attention(torch.randn(3, 3, 8), torch.randn(2, 5, 8), torch.randn(2, 5, 8),
                  torch.ones(3, 5, dtype=torch.bool), 1.0)


def _reference_rope(x, cos, sin, rot, neox):
    """The textbook rotation: halves (neox) or adjacent pairs, then the untouched tail."""
    half = rot // 2
    if neox:
        x1, x2 = x[..., :half], x[..., half:rot]
        out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
    else:
        x1, x2 = x[..., 0:rot:2], x[..., 1:rot:2]
        out = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).flatten(-2)
    return torch.cat([out, x[..., rot:]], -1)


@pytest.mark.parametrize("neox", [True, False], ids=["neox", "adjacent"])
@pytest.mark.parametrize("rot,d,t", [(64, 64, 1), (32, 48, 3), (8, 8, 5)], ids=str)
def test_rope(plans, neox, rot, d, t):
    x = torch.randn(t, 3, d).transpose(0, 1)             # [heads, T, d] as the decoder has it
    cos, sin = torch.randn(t, rot // 2), torch.randn(t, rot // 2)
    c, s = pair_tables(cos, sin, neox)
    torch.testing.assert_close(apply_rope(x, c, s, rot, neox, 0.5),
                               _reference_rope(x, cos, sin, rot, neox) * 0.5)
    check(lambda x, c, s: apply_rope(x, c, s, rot, neox, 0.5), x, c, s)
    if rot == d:                       # the rotation and the scale: one kernel
        assert len(_names(plans)) == 1, _names(plans)


class RopeIntoCache(torch.nn.Module):
    """A decode step's keys: rotated, then written into a cache at their positions."""

    def __init__(self, heads, c, d):
        super().__init__()
        self.register_buffer("cache", torch.randn(heads, c, 2, d // 2))   # the pair layout

    def forward(self, k, cos, sin, pos):
        self.cache.index_copy_(1, pos, apply_rope(k, cos, sin, k.shape[-1], True, flat=False))
        return self.cache.flatten(2) * 1.0


@pytest.mark.parametrize("t", [1, 3])
def test_rope_into_the_cache_is_one_kernel(plans, t):
    """The rotation is computed by the scatter that writes the cache (in place)."""
    heads, c, d = 3, 11, 16
    eager, compiled_mod = RopeIntoCache(heads, c, d), RopeIntoCache(heads, c, d)
    compiled_mod.cache.copy_(eager.cache)
    k = torch.randn(t, heads, d).transpose(0, 1)
    cs, sn = pair_tables(torch.randn(t, d // 2), torch.randn(t, d // 2), True)
    pos = torch.arange(4, 4 + t)
    with torch.no_grad():
        want = eager(k, cs, sn, pos)
        got = torch.compile(compiled_mod, backend="vulkan", dynamic=False)(k, cs, sn, pos)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(compiled_mod.cache, eager.cache)
    names = _names(plans)
    assert len(names) == 2, names          # the rotating scatter, then the graph's cache * 1


class DecodeAttention(torch.nn.Module):
    """A decoder layer's attention step as models/decoder.py writes it: q and k rotated,
    the keys written into their cache in RoPE's pair layout and the values into theirs at
    the step's positions (in place), then attention over both caches."""

    def __init__(self, hq, hkv, c, d, neox):
        super().__init__()
        self.neox, self.hq = neox, hq
        pairs = (2, d // 2) if neox else (d // 2, 2)
        self.register_buffer("k_cache", torch.randn(hkv, c, *pairs))
        self.register_buffer("v_cache", torch.randn(hkv, c, d))

    def forward(self, q, k, v, cos, sin, pos, mask):
        d = q.shape[-1]
        q = apply_rope(q, cos, sin, d, self.neox, 0.125)
        self.k_cache.index_copy_(1, pos, apply_rope(k, cos, sin, d, self.neox, flat=False))
        self.v_cache.index_copy_(1, pos, v)
        return attention(q, self.k_cache.flatten(2), self.v_cache, mask, 1.0)


@pytest.mark.parametrize("neox", [True, False], ids=["neox", "adjacent"])
@pytest.mark.parametrize("hq,hkv,c,t,d", [(6, 2, 300, 1, 32), (4, 4, 40, 1, 32), (6, 2, 300, 3, 32),
                                          (28, 4, 70, 1, 128)], ids=str)
def test_decode_attention_computes_the_steps_cache_rows(as_gpu, plans, neox, hq, hkv, c, t, d):
    """One decode row: the attention rotates q as it loads it and computes the step's
    key and value rows itself (never reading them from the caches), so it runs beside
    the scatters that write them, with no barrier between; calls at positions in other
    splits of the keys give eager's output and caches. Several rows (a prompt): the
    plain kernels, same results. The 28 x 128 heads are a 7B model's (Qwen2-7B): the
    kernel's source must not grow with the rows it loads."""
    from dynamo_vulkan.runtime.plan import barriers
    eager, mod = DecodeAttention(hq, hkv, c, d, neox), DecodeAttention(hq, hkv, c, d, neox)
    mod.load_state_dict(eager.state_dict())
    mod.k_cache.copy_(eager.k_cache)
    mod.v_cache.copy_(eager.v_cache)
    fn = torch.compile(mod, backend="vulkan", dynamic=False)
    for p in (3, c // 2, c - t):
        q, k, v = torch.randn(hq, t, d), torch.randn(hkv, t, d), torch.randn(hkv, t, d)
        cs, sn = pair_tables(torch.randn(t, d // 2), torch.randn(t, d // 2), neox)
        pos = torch.arange(p, p + t)
        mask = torch.arange(c)[None, :] <= pos[:, None]
        with torch.no_grad():
            want = eager(q, k, v, cs, sn, pos, mask)
            got = fn(q, k, v, cs, sn, pos, mask)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(mod.k_cache, eager.k_cache)
        torch.testing.assert_close(mod.v_cache, eager.v_cache)
    plan = plans[-1]
    at = [i for i, x in enumerate(plan.dispatches) if x.name == "attention"]
    assert len(at) == 1, [x.name for x in plan.dispatches]
    note, waits = plan.dispatches[at[0]].note, barriers(plan.dispatches)
    if t == 1:
        assert note.startswith("rope + ") and "the step's k/v rows computed here" in note, note
        source = str(plan.sources[plan.dispatches[at[0]].spirv_key])
        assert "uint[](" not in source, "a table of row offsets in the kernel"
        # the scatters and the attention: one level, the mask's ranges (a kernel reading
        # the mask, which is an input here) before it
        ranges = [i for i, x in enumerate(plan.dispatches) if x.name == "mask_ranges"]
        assert len(ranges) == 1 and ranges[0] < at[0], [x.name for x in plan.dispatches]
        waits = barriers([x for x in plan.dispatches if x.name != "mask_ranges"])
        assert not any(waits), "the attention waits for the cache scatters"
    else:
        assert "rope" not in note and "computed here" not in note, note
        assert waits[at[0]]
