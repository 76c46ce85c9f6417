"""Indices out of range in kernels: every indexing op raises as eager does (an IndexError
naming the op; gather and scatter's RuntimeError too), never reads out of bounds or
returns 0; negative indices count from the end only where eager allows them; the
program works again on the next call."""
import pytest
import torch
import torch.nn.functional as F

import dynamo_vulkan
from vk import check, compiled

X = torch.randn(5, 4)
ROWS2 = torch.ones(5, 2)

# name: (fn(x, idx), an index in range, one out of range); each result is used by an
# elementwise op, so the indexing kernel runs inside a larger program
CASES = {
    "index": (lambda x, i: x[i] * 2, [0, -5, 4], [0, 5]),
    "index_negative": (lambda x, i: x[i] * 2, [-1, -5], [0, -6]),
    "index_dim1": (lambda x, i: x[:, i] + 1, [3, -4], [4]),
    "index_select": (lambda x, i: torch.index_select(x, 0, i) * 2, [1, 4], [1, 5]),
    "index_select_negative": (lambda x, i: torch.index_select(x, 1, i) * 2, [0, 3], [-1]),
    "embedding": (lambda x, i: F.embedding(i, x) * 2, [[1, 4]], [[1, 9]]),
    "embedding_negative": (lambda x, i: F.embedding(i, x) * 2, [[0]], [[-1]]),
    "gather": (lambda x, i: torch.gather(x, 1, i) * 2, [[0, 3]] * 5, [[0, 4]] * 5),
    "gather_negative": (lambda x, i: torch.gather(x, 1, i) * 2, [[1, 2]] * 5, [[0, -1]] * 5),
    "scatter": (lambda x, i: torch.scatter(x, 1, i, 1.5) * 2, [[0, 3]] * 5, [[0, 4]] * 5),
    "scatter_add": (lambda x, i: torch.scatter_add(x, 1, i, ROWS2) * 2, [[0, 3]] * 5, [[-1, 0]] * 5),
    "index_put": (lambda x, i: torch.index_put(x, (i,), torch.ones(4)) * 2, [4], [5]),
    "index_put_accumulate": (lambda x, i: torch.index_put(x, (i,), torch.ones(4), accumulate=True) * 2,
                             [-5], [-6]),
    "take": (lambda x, i: torch.take(x, i) * 2, [3, 19, -20], [3, 20]),
}


W6 = torch.randn(6, 3)
# name: (fn(idx, offsets), indices and offsets in range, out of range), the bags of W6
BAGS = {
    "sum": (lambda i, o: F.embedding_bag(i, W6, o) * 2, ([0, 5, 2], [0, 2]), ([0, 6, 2], [0, 2])),
    "mean_negative": (lambda i, o: F.embedding_bag(i, W6, o, mode="mean") + 1,
                      ([1, 2, 3], [0, 1]), ([1, -1, 3], [0, 1])),
    "max_last_bag": (lambda i, o: F.embedding_bag(i, W6, o, mode="max") * 2,
                     ([4, 1, 3], [0, 1]), ([4, 1, 7], [0, 1])),
    "padding_idx": (lambda i, o: F.embedding_bag(i, W6, o, padding_idx=2) * 2,
                    ([2, 5, 2], [0, 1]), ([2, 5, 9], [0, 1])),
    "offsets_past_the_end": (lambda i, o: F.embedding_bag(i, W6, o) * 2,
                             ([0, 5, 2], [0, 3]), ([0, 5, 2], [0, 4])),
    "offsets_decreasing": (lambda i, o: F.embedding_bag(i, W6, o) * 2,
                           ([0, 5, 2], [0, 2, 2]), ([0, 5, 2], [0, 2, 1])),
    "offsets_not_from_0": (lambda i, o: F.embedding_bag(i, W6, o) * 2,
                           ([0, 5, 2], [0, 1]), ([0, 5, 2], [1, 2])),
}


@pytest.mark.parametrize("name", list(BAGS))
def test_embedding_bag_out_of_range_raises(name):
    """Indices out of range and offsets eager rejects raise (IndexError and RuntimeError,
    as eager's RuntimeError), never a bag summed without its row."""
    fn, good, bad = BAGS[name]
    good, bad = [torch.tensor(t) for t in good], [torch.tensor(t) for t in bad]
    with pytest.raises(RuntimeError):
        fn(*bad)
    check(fn, *good)
    run = compiled(fn)
    with pytest.raises(IndexError, match="embedding_bag: offsets" if "offsets" in name
                       else "embedding_bag: index out of range"):
        run(*bad)
    with pytest.raises(RuntimeError):
        run(*bad)
    torch.testing.assert_close(run(*good), fn(*good))


@pytest.mark.parametrize("split", [False, True], ids=["one_buffer", "split_weight"])
def test_gguf_embedding_out_of_range_raises(monkeypatch, split):
    """The GGUF embedding lookup checks its ids, in one buffer and in a weight split
    across buffers (each chunk gathers the ids it holds)."""
    from dynamo_vulkan import device
    from dynamo_vulkan.gguf.op import gguf_embedding
    from dynamo_vulkan.gguf.quants import quant_info
    from dynamo_vulkan.lowering import gguf as gguf_lowering
    from gguf_fixtures import blocks_of
    qt, rows, cols = quant_info("Q8_0").ggml_type, 40, 64     # 68-byte rows
    if split:
        monkeypatch.setattr(gguf_lowering, "WEIGHT_BUFFER_MAX", 15 * 68)
        monkeypatch.setitem(device.device_info(), "name",
                            device.device_info()["name"] + " (weight buffers of 1020)")
    blocks = blocks_of("Q8_0", rows, cols, 5)
    fn = lambda i, b: gguf_embedding(i, b, qt, rows, cols) * 2            # noqa: E731
    good, bad = torch.tensor([[0, 39], [16, 30]]), torch.tensor([[0, 40], [16, 30]])
    with pytest.raises(IndexError):
        fn(bad, blocks)
    check(fn, good, blocks)
    run = compiled(fn)
    for ids in (bad, torch.tensor([-1, 3])):
        with pytest.raises(IndexError, match="gguf_embedding: index out of range"):
            run(ids, blocks)
    torch.testing.assert_close(run(good, blocks), fn(good, blocks))


@pytest.mark.parametrize("name", list(CASES))
def test_out_of_range_index_raises(name):
    fn, good, bad = CASES[name]
    good, bad = torch.tensor(good), torch.tensor(bad)
    with pytest.raises((IndexError, RuntimeError)):
        fn(X, bad)                              # eager raises: the case means what it says
    check(fn, X, good)
    run = compiled(fn)
    n_reports = len(dynamo_vulkan.reports())
    with pytest.raises(IndexError, match=name.split("_negative")[0].split("_dim1")[0]
                       .replace("index_put_accumulate", "index_put")):
        run(X, bad)
    assert not [n for r in dynamo_vulkan.reports()[n_reports:] for n in r.cpu_nodes], \
        "the indexing op ran on the CPU, so its kernel was not checked"
    torch.testing.assert_close(run(X, good), fn(X, good))   # the next call works


def test_gather_and_scatter_raise_runtime_error_too():
    """eager's gather and scatter raise RuntimeError; the kernel's error is both."""
    fn, _, bad = CASES["gather"]
    with pytest.raises(RuntimeError, match="gather"):
        compiled(fn)(X, torch.tensor(bad))


def test_several_checks_name_the_first_failing_op():
    def fn(x, i, j):
        return torch.index_select(x, 0, i) * 2, torch.gather(x, 1, j) + 1
    i_ok, j_bad = torch.tensor([0, 4]), torch.tensor([[0, 7]] * 5)
    run = compiled(fn)
    with pytest.raises(IndexError, match="gather"):
        run(X, i_ok, j_bad)
    with pytest.raises(IndexError, match="index_select: .*and 1 more"):
        run(X, torch.tensor([9]), j_bad)
    want = fn(X, i_ok, j_bad.clamp(max=3))
    for g, w in zip(run(X, i_ok, j_bad.clamp(max=3)), want):
        torch.testing.assert_close(g, w)


BIG = 2**30
# name: (fn, input whose int64 result leaves int32, input whose result fits)
INT64 = {
    "mul": (lambda x: x * x, [3, 50000], [3, -46340]),
    "mul_scalar": (lambda x: x * 100000, [30000], [-21474]),
    "add": (lambda x: x + x, [BIG, 1], [BIG - 1, -BIG]),
    "sub": (lambda x: -x - x - 1, [BIG, 1], [BIG - 1, 5]),
    "neg": (lambda x: -x, [-2**31, 4], [-2**31 + 1]),
    "abs": (lambda x: x.abs(), [-2**31], [-2**31 + 1, 7]),
    "lshift": (lambda x: x << 33, [1, 0], [0]),
    "lshift_small": (lambda x: x << 5, [2**27], [2**25, -2**26]),
    "sum": (lambda x: x.sum(), [BIG, BIG, -1, 1], [BIG, BIG - 1, 1, -1, -BIG]),
    "sum_dim": (lambda x: x.view(2, -1).sum(1), [BIG, BIG, 0, 0], [BIG, BIG - 1, -BIG, -BIG]),
    "cumsum": (lambda x: x.cumsum(0), [BIG, BIG, -BIG], [BIG, BIG - 1, -BIG, BIG]),
    "sum_of_int32": (lambda x: x.to(torch.int32).sum() + 0, [BIG, BIG], [BIG, BIG - 1]),
    # products: wrapped to the other sign (2^31), to 0 (2^32), far beyond; -2^31 fits;
    # partial products beyond int32 before a 0 give 0
    "prod": (lambda x: x.prod(), [2] * 31, [-2] * 31),
    "prod_to_zero": (lambda x: x.prod(), [2] * 32, [2**20, 2**20, 0, 7]),
    "prod_far": (lambda x: x.prod(), [50000, -50000, 50000], [46340, -46340, 1]),
    "prod_dim": (lambda x: x.view(2, -1).prod(1), [3, 5, 2**20, 2**12], [3, 5, 2**20, 2**10]),
    "prod_of_int32": (lambda x: x.to(torch.int32).prod() + 0, [2**16, 2**15], [2**16, -2**15]),
    "cumprod": (lambda x: x.cumprod(0), [2**16, 2**15, 1], [2**16, -2**15, 0, 5]),
    "cumprod_far": (lambda x: x.view(2, -1).cumprod(1), [7, 2**20, 2**20, 3, 1, 1],
                    [7, 2**20, 1, 3, 1, 1]),
    "pow": (lambda x: x ** 3, [1291, 2], [1290, -1290]),
    "pow_tensor": (lambda x: x ** x.abs(), [14, 2], [3, -2, 0, 1, -1]),
    "pow_scalar_base": (lambda x: 3 ** x, [20], [19, 0, 1]),
}


@pytest.mark.parametrize("name", list(INT64))
def test_int64_result_outside_int32_raises(name):
    """int64 values travel as int32 on the GPU: a result that does not fit is an
    OverflowError after the submit, never a wrapped value; one that fits is exact."""
    fn, bad, good = INT64[name]
    bad, good = torch.tensor(bad), torch.tensor(good)
    want = fn(bad)
    assert ((want < -2**31) | (want >= 2**31)).any(), "the case leaves int32 in eager"
    run = compiled(fn)
    with pytest.raises(OverflowError, match="does not fit in int32"):
        run(bad)
    torch.testing.assert_close(run(good), fn(good))


def test_float_to_int64_out_of_range_raises():
    fn = lambda x: (x * 1e10).long()                                  # noqa: E731
    run = compiled(fn)
    with pytest.raises(OverflowError, match="does not fit in int32"):
        run(torch.tensor([1.0, 0.5]))
    with pytest.raises(OverflowError):
        run(torch.tensor([float("nan")]))
    torch.testing.assert_close(run(torch.tensor([0.1, -0.2, 0.0])), fn(torch.tensor([0.1, -0.2, 0.0])))



def test_int64_negative_tensor_powers_as_eager():
    """Integers to negative powers from a tensor: 0, or +-1 for a base of +-1, as eager."""
    check(lambda x, y: x ** y, torch.tensor([2, 3, 1, -1, -1, 0]), torch.tensor([1, -1, -5, -3, -2, 2]))
