"""Convolution (lowering/conv.py) and pooling (lowering/pool.py) against eager."""
import pytest
import torch
import torch.nn.functional as F

import dynamo_vulkan as dynamodule
from vk import check, compiled, noncontig

torch.manual_seed(0)


@pytest.mark.parametrize("groups,stride,padding,dilation", [
    (1, 1, 0, 1), (2, (2, 1), (1, 2), (1, 2)), (4, 3, 2, 1), (1, 1, 1, 3)], ids=str)
def test_conv2d(groups, stride, padding, dilation):
    x, w, b = torch.randn(2, 4, 7, 9), torch.randn(6 if groups != 4 else 8, 4 // groups, 3, 2), None
    b = torch.randn(w.shape[0])
    check(lambda x, w, b: F.conv2d(x, w, b, stride, padding, dilation, groups), x, w, b)


def test_conv2d_noncontiguous_size_one_and_unbatched():
    check(lambda x, w: F.conv2d(x, w), noncontig(torch.randn(1, 3, 5, 5)), torch.randn(2, 3, 1, 1))
    check(lambda x, w: F.conv2d(x, w, padding=1), torch.randn(3, 5, 5), torch.randn(2, 3, 3, 3))
    check(lambda x, w: F.conv2d(x, w), torch.randn(2, 1, 1, 1), torch.randn(1, 1, 1, 1))
    x = torch.randn(2, 5, 6, 3).permute(0, 3, 1, 2)         # channels-last layout
    check(lambda x, w: F.conv2d(x, w, padding=1), x, torch.randn(4, 3, 3, 3))


def test_conv1d_and_conv3d():
    check(lambda x, w, b: F.conv1d(x, w, b, padding=1, stride=2), torch.randn(3, 4, 11),
          torch.randn(5, 4, 3), torch.randn(5))
    check(lambda x, w: F.conv3d(x, w, padding=1), torch.randn(1, 2, 4, 5, 6),
          torch.randn(3, 2, 3, 3, 3))


@pytest.mark.parametrize("stride,padding,output_padding,groups,dilation", [
    (1, 0, 0, 1, 1), (2, 1, 1, 2, 2), (3, 0, 2, 1, 1)], ids=str)
def test_conv_transpose2d(stride, padding, output_padding, groups, dilation):
    x, w, b = torch.randn(2, 4, 5, 6), torch.randn(4, 3, 3, 2), torch.randn(3 * groups)
    check(lambda x, w, b: F.conv_transpose2d(x, w, b, stride, padding, output_padding, groups,
                                             dilation), x, w, b)


def test_conv_transpose1d():
    check(lambda x, w: F.conv_transpose1d(x, w, stride=2, padding=1), torch.randn(2, 3, 7),
          torch.randn(3, 5, 4))


def _grads_equal_eager(conv, x, w):
    """The input's and the weight's gradients of sum(conv(x, w) * r) through the backend
    equal eager's, and the backward graph ran on Vulkan."""
    r = torch.randn_like(conv(x, w))
    want = torch.autograd.grad((conv(x, w) * r).sum(), (x, w))
    before = len(dynamodule.reports())
    xs, ws = (t.detach().clone().requires_grad_() for t in (x, w))
    (compiled(lambda x, w: (conv(x, w) * r).sum())(xs, ws)).backward()
    for got, exp in zip((xs.grad, ws.grad), want):
        torch.testing.assert_close(got, exp, rtol=1e-4, atol=1e-4)
    reports = dynamodule.reports()[before:]
    assert [r.kind for r in reports] == ["forward", "backward"]
    assert not any(r.cpu_nodes for r in reports), [r.cpu_nodes for r in reports]
    return reports


@pytest.mark.parametrize("nd,groups,stride,padding,dilation", [
    (2, 1, 1, 1, 1), (2, 2, (2, 1), (1, 2), (1, 2)), (2, 1, 3, 0, 1), (1, 1, 2, 1, 1),
    (3, 1, 1, (0, 1, 1), 1), (2, 3, 2, 1, 2)], ids=str)
def test_conv_gradients(nd, groups, stride, padding, dilation):
    """The weight's gradient is a product of the output's gradient with the input's
    windows: strides that leave input positions over (size 10, stride 3), groups, dilation,
    1-d and 3-d."""
    spatial = {1: (11,), 2: (10, 7), 3: (4, 5, 6)}[nd]
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd]
    x = torch.randn(2, 3 * groups, *spatial, requires_grad=True)
    w = torch.randn(2 * groups, 3, *(3, 2, 2)[:nd], requires_grad=True)
    _grads_equal_eager(lambda x, w: conv(x, w, None, stride, padding, dilation, groups), x, w)


def test_conv_weight_gradient_in_chunks_of_images(monkeypatch):
    """A batch whose windows exceed the budget sums its images' products in chunks (here
    of two images, 3 x 3 offsets x 4 channels x 6 x 6 positions x 4 bytes each: 2 + 2 + 1)."""
    from dynamo_vulkan.lowering import backward_decomps
    monkeypatch.setattr(backward_decomps, "WINDOWS_MAX_BYTES", 2 * 9 * 4 * 36 * 4)
    x = torch.randn(5, 4, 8, 8, requires_grad=True)
    w = torch.randn(3, 4, 3, 3, requires_grad=True)
    reports = _grads_equal_eager(lambda x, w: F.conv2d(x, w), x, w)
    products = [n for n in reports[1].nodes if n.op in ("aten.bmm.default", "aten.mm.default")]
    assert len(products) == 3, [n.op for n in reports[1].nodes]


def test_conv_transpose_gradients():
    x = torch.randn(2, 4, 5, 6, requires_grad=True)
    w = torch.randn(4, 3, 3, 2, requires_grad=True)
    _grads_equal_eager(lambda x, w: F.conv_transpose2d(x, w, None, 2, 1, 1, 2, 2), x, w)


@pytest.mark.parametrize("kernel,stride,padding,dilation,ceil_mode", [
    (3, 2, 1, 1, True), ((2, 3), None, 0, 2, False), (1, 1, 0, 1, False), (2, 2, 1, 1, False)],
    ids=str)
def test_max_pool2d_with_indices(kernel, stride, padding, dilation, ceil_mode):
    x = torch.randn(2, 3, 9, 11)
    x[0, 0, 1, 1] = float("nan")
    check(lambda x: F.max_pool2d(x, kernel, stride, padding, dilation, ceil_mode,
                                 return_indices=True), x)


def test_max_pool_1d_3d_noncontiguous_and_unbatched():
    check(lambda x: F.max_pool1d(x, 2), torch.randn(2, 3, 9))
    check(lambda x: F.max_pool2d(x, 2, return_indices=True), noncontig(torch.randn(2, 3, 6, 5)))
    check(lambda x: F.max_pool2d(x, 3, 1, 1), torch.randn(3, 6, 5))
    check(lambda x: F.max_pool3d(x, 2, return_indices=True), torch.randn(1, 2, 5, 6, 7))


@pytest.mark.parametrize("ceil_mode,count_include_pad,divisor", [
    (False, True, None), (True, False, None), (True, True, None), (False, True, 3)], ids=str)
def test_avg_pool2d(ceil_mode, count_include_pad, divisor):
    check(lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode, count_include_pad, divisor),
          torch.randn(2, 3, 9, 10))


def test_avg_pool_1d_3d():
    check(lambda x: F.avg_pool1d(x, 3, padding=1), torch.randn(2, 3, 9))
    check(lambda x: F.avg_pool3d(x, 2, 1), noncontig(torch.randn(1, 2, 4, 5, 6)))


@pytest.mark.parametrize("size", [(4, 3), (1, 1), (9, 11), (5, 2)], ids=str)
def test_adaptive_pools(size):
    x = torch.randn(2, 3, 9, 11)
    check(lambda x: (F.adaptive_avg_pool2d(x, size), F.adaptive_max_pool2d(x, size, True)), x)


def test_adaptive_pools_1d_3d_unbatched():
    check(lambda x: (F.adaptive_avg_pool1d(x, 4), F.adaptive_max_pool1d(x, 4)),
          torch.randn(2, 3, 9))
    check(lambda x: F.adaptive_avg_pool3d(x, (2, 3, 1)), torch.randn(1, 2, 5, 6, 7))
    check(lambda x: F.adaptive_avg_pool2d(x, (4, 3)), noncontig(torch.randn(3, 9, 11)))


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [True, False])
def test_grid_sample(mode, padding, align):
    x, g = torch.randn(2, 3, 5, 7), torch.rand(2, 4, 6, 2) * 2.4 - 1.2    # some outside [-1, 1]
    check(lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding, align_corners=align),
          x, g)


def test_grid_sample_noncontiguous():
    check(lambda x, g: F.grid_sample(x, g, align_corners=False), noncontig(torch.randn(1, 2, 4, 4)),
          noncontig(torch.rand(1, 3, 3, 2) * 2 - 1))


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
def test_grid_sample_3d(mode, padding):
    x, g = torch.randn(2, 3, 4, 5, 6), torch.rand(2, 3, 2, 4, 3) * 2.4 - 1.2
    for align in (True, False):
        torch._dynamo.reset()
        check(lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding,
                                         align_corners=align), x, g)
