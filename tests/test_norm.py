"""Batch norm and group norm (lowering/norm.py) and the reduce family's
variance, product and arg reductions (lowering/reduce.py) against eager."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from vk import check, compiled, noncontig

torch.manual_seed(0)


@pytest.mark.parametrize("shape", [(4, 3, 5, 7), (5, 3), (2, 3, 1), (1, 3, 2, 2, 2)], ids=str)
def test_batch_norm_inference(shape):
    x = torch.randn(shape)
    rm, rv, w, b = torch.randn(3), torch.rand(3) + 0.5, torch.randn(3), torch.randn(3)
    check(lambda x, rm, rv, w, b: F.batch_norm(x, rm, rv, w, b, training=False, eps=1e-3),
          x, rm, rv, w, b)
    check(lambda x, rm, rv: F.batch_norm(x, rm, rv, training=False), noncontig(x), rm, rv)


def test_batch_norm_training_updates_running_stats():
    x, w, b = torch.randn(4, 3, 5, 7), torch.randn(3), torch.randn(3)
    rm, rv = torch.randn(3), torch.rand(3) + 0.5

    def f(x, rm, rv, w, b):
        return F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.3), rm, rv

    expected = f(x, rm.clone(), rv.clone(), w, b)
    got = compiled(f)(x, rm.clone(), rv.clone(), w, b)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_batch_norm_module_train_and_eval():
    m = nn.BatchNorm2d(3)
    m.running_mean.normal_()
    x = torch.randn(2, 3, 4, 4)
    with torch.no_grad():
        check(m.eval(), x)
    check(lambda x: F.batch_norm(x, None, None, training=True), torch.randn(5, 3))
    check(lambda x: torch.native_batch_norm(x, None, None, None, None, True, 0.1, 1e-5),
          torch.randn(2, 4, 7))


@pytest.mark.parametrize("shape,groups", [((2, 6, 5, 3), 3), ((2, 4, 7), 2), ((1, 3, 1), 1),
                                          ((3, 4, 2, 2), 4)], ids=str)
def test_group_norm(shape, groups):
    c = shape[1]
    w, b = torch.randn(c), torch.randn(c)
    check(lambda x, w, b: F.group_norm(x, groups, w, b, eps=1e-3), torch.randn(shape), w, b)
    check(lambda x: F.group_norm(x, groups), noncontig(torch.randn(shape)))


def test_native_group_norm_saved_stats():
    check(lambda x: torch.native_group_norm(x, None, None, 2, 4, 7, 2, 1e-5), torch.randn(2, 4, 7))


def test_native_layer_norm_saved_stats():
    w, b = torch.randn(6), torch.randn(6)
    check(lambda x, w, b: torch.native_layer_norm(x, (6,), w, b, 1e-5), torch.randn(3, 4, 6), w, b)
    check(lambda x: torch.native_layer_norm(x, (4, 6), None, None, 1e-5),
          noncontig(torch.randn(3, 4, 6)))


@pytest.mark.parametrize("shape,k,affine,mask", [
    ((3, 4, 6), 1, True, (True, True, True)),
    ((2, 7, 33), 1, True, (False, True, True)),
    ((2, 7, 33), 2, True, (True, False, True)),
    ((3, 4, 6), 2, False, (True, False, False)),
    ((5, 1), 1, True, (True, True, True)),
    ((1, 130), 1, True, (True, True, False)),
    ((2, 3, 5), 3, True, (True, True, True)),     # every dim normalised: no column sums
], ids=str)
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
def test_layer_norm_backward(plans, shape, k, affine, mask, strided):
    """native_layer_norm_backward lowered whole (rowwise.layer_norm_backward): dx from one
    row kernel, the weight's and bias's gradients from column sums, for each output mask,
    with and without the affine parameters, on strided views; the kernels read only the
    graph's inputs, so they run as one barrier level."""
    from dynamo_vulkan.runtime.plan import barriers
    norm = shape[len(shape) - k:]
    w, b = (torch.randn(norm), torch.randn(norm)) if affine else (None, None)
    x, dy = torch.randn(shape) * 3 + 1, torch.randn(shape)
    if strided:
        x, dy = noncontig(x), noncontig(dy)
    _, mean, rstd = torch.native_layer_norm(x, norm, w, b, 1e-5)

    def f(dy, x, mean, rstd, w, b):
        return tuple(g for g in torch.ops.aten.native_layer_norm_backward(
            dy, x, norm, mean, rstd, w, b, list(mask)) if g is not None)
    check(f, dy, x, mean, rstd, w, b)
    ds = plans[-1].dispatches
    names = [d.name for d in ds]
    assert names.count("rowwise:layer_norm_backward") == mask[0], names
    assert sum(n.startswith("reduce:sum") for n in names) == sum(mask[1:]) * affine * (k < len(shape)), names
    if not strided and k < len(shape):
        assert not any(barriers(ds)), names


def test_var_std():
    x = torch.randn(5, 7, 300)
    check(lambda x: (torch.var(x, 1), torch.std(x, (0, 2), keepdim=True),
                     torch.var(x, correction=0), torch.std(x, unbiased=False)), x)
    check(lambda x: torch.var_mean(x, 1, correction=2), noncontig(x))
    check(lambda x: torch.std_mean(x, -1, keepdim=True), x)
    check(lambda x: torch.var(x, 0), torch.randn(1, 3))      # a single sample: NaN as in eager


def test_arg_reductions_nan_and_ties():
    x = torch.randn(5, 7, 300)
    x[0, 0, 5] = float("nan")
    x[0, 0, 9] = float("nan")
    x[1, 2, 7] = x[1, 2].max()
    check(lambda x: (torch.argmax(x, -1), torch.argmin(x, 1, keepdim=True), torch.argmax(x),
                     torch.argmin(x)), x)
    check(lambda x: torch.max(x, -1), x)
    check(lambda x: torch.min(x, 0), noncontig(torch.randn(3, 4)))
    check(lambda x: torch.max(x, 1), torch.randint(0, 4, (3, 9)))
    check(lambda x: torch.argmax(x), torch.tensor(3.0))


@pytest.mark.parametrize("n", [8192, 8193, 49152 + 7])
def test_arg_reductions_of_long_rows_split_in_two_passes(n):
    """An LM head's argmax: rows this long run over many workgroups, then their
    pairs; ties across chunks go to the first index, NaN wins, ints and views too."""
    x = torch.randn(2, n)
    x[0, 100] = x[0, n - 3] = x[0].max() + 1          # tie: chunks 0 and last
    x[1, 5000] = float("nan")
    check(lambda x: (torch.argmax(x, -1), torch.argmin(x, 1, keepdim=True), torch.max(x, 1)), x)
    check(lambda x: torch.argmax(x), noncontig(torch.randn(1, n)))
    check(lambda x: torch.min(x, -1), torch.randint(-3, 3, (3, n)))
    check(lambda x: torch.argmax(x, 0), torch.randn(n, 2).t().contiguous().t())


def test_prod_and_full_min_max():
    check(lambda x: (torch.prod(x, 1), torch.prod(x)), torch.rand(3, 9) + 0.5)
    check(lambda x: torch.prod(x, 0), torch.randint(-3, 4, (5, 2)))
    check(lambda x: (torch.max(x), torch.min(x)), noncontig(torch.randn(3, 9)))


def test_batch_norm_with_update_and_legit_eval_forms():
    x, w, b = torch.randn(3, 2, 4), torch.randn(2), torch.randn(2)
    rm, rv = torch.randn(2), torch.rand(2) + 0.5
    check(lambda x, w, b, rm, rv: torch.ops.aten._batch_norm_with_update_functional(
        x, w, b, rm, rv, 0.1, 1e-5)[:3] + torch.ops.aten._batch_norm_with_update_functional(
        x, w, b, rm, rv, 0.1, 1e-5)[4:], x, w, b, rm, rv)
    check(lambda x, w, b, rm, rv: torch.ops.aten._native_batch_norm_legit_functional(
        x, w, b, rm, rv, False, 0.1, 1e-5), x, w, b, rm, rv)
