"""Elementwise family (lowering/elementwise.py) against eager CPU."""
import pytest
import torch
import torch.nn.functional as F

from vk import check, noncontig

torch.manual_seed(0)
SHAPES = [((), ()), ((1,), (7,)), ((5, 1, 3), (4, 1)), ((3, 7), (3, 7)), ((2, 1, 9), (1, 5, 1))]

BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "add_alpha": lambda a, b: torch.add(a, b, alpha=2.5), "sub_alpha": lambda a, b: torch.sub(a, b, alpha=0.5),
    "maximum": torch.maximum, "minimum": torch.minimum,
    "pow": lambda a, b: torch.pow(a.abs() + 0.1, b), "atan2": torch.atan2,
    "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
    "where": lambda a, b: torch.where(a > 0, a, b),
    "clamp_t": lambda a, b: torch.clamp(a, min=b, max=b + 1),
}
UNARY = {
    "neg": torch.neg, "exp": torch.exp, "log": lambda x: torch.log(x.abs() + 1e-3),
    "sqrt": lambda x: torch.sqrt(x.abs()), "rsqrt": lambda x: torch.rsqrt(x.abs() + 0.1),
    "abs": torch.abs, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": torch.relu,
    "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu,
    "clamp": lambda x: torch.clamp(x, -0.5, 0.7), "clamp_min": lambda x: x.clamp(min=0.1),
    "pow2": lambda x: x ** 2, "pow_scalar_base": lambda x: 2.0 ** x, "recip": lambda x: 1 / (x.abs() + 1),
    "scalar_ops": lambda x: (x + 1.5) * 3 - 2 / (x.abs() + 1),
    "sin": torch.sin, "erf": torch.erf, "floor": torch.floor, "sign": torch.sign,
    "leaky_relu": F.leaky_relu, "hardtanh": F.hardtanh, "log_sigmoid_chain": lambda x: torch.log(torch.sigmoid(x)),
}


@pytest.mark.parametrize("name", list(BINARY))
@pytest.mark.parametrize("shapes", SHAPES, ids=str)
def test_binary(name, shapes):
    a, b = torch.randn(shapes[0]), torch.randn(shapes[1])
    check(BINARY[name], a, b)


@pytest.mark.parametrize("name", list(BINARY))
def test_binary_noncontiguous(name):
    a = noncontig(torch.randn(4, 6))
    b = torch.randn(6, 4).t()
    check(BINARY[name], a, b)


@pytest.mark.parametrize("name", list(UNARY))
@pytest.mark.parametrize("shape", [(), (1,), (3, 1, 5), (129, 33)], ids=str)
def test_unary(name, shape):
    check(UNARY[name], torch.randn(shape) * 3)


@pytest.mark.parametrize("name", ["exp", "tanh", "relu", "gelu", "silu", "abs"])
def test_unary_noncontiguous(name):
    check(UNARY[name], noncontig(torch.randn(5, 7)).transpose(0, 1))


def test_special_values():
    x = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e30, -1e30, 80.0, -80.0])
    check(lambda t: (torch.tanh(t), torch.sigmoid(t), torch.relu(t), t.clamp(-1, 1), torch.exp(t)), x)


def test_integer_and_bool():
    a = torch.randint(-50, 50, (4, 5))
    b = torch.randint(1, 9, (5,))
    check(lambda x, y: (x + y, x * y, x - 3, x > y, (x > 0) & (y < 5), x.abs(), -x), a, b)


def test_int64_result_roundtrip_and_cast():
    a = torch.randn(3, 4) * 10
    check(lambda x: (x.to(torch.int64), (x > 0).float(), x.to(torch.int32) * 2), a)


def test_large_numel_uses_2d_grid():
    x = torch.randn(65535 * 256 + 17)
    check(lambda t: t * 2 + 1, x)


@pytest.mark.parametrize("case", ["same shape", "scalar", "aligned slice", "odd offset",
                                  "odd count", "int and bool"])
def test_flat_kernels_move_four_elements_per_invocation(plans, case):
    """Contiguous operands whose offsets and count are multiples of 4 take the vec4
    form of the kernel (16-byte loads and stores); the rest the scalar form."""
    a, b = torch.randn(96, 8), torch.randn(96, 8)
    fn, args, vec = {
        "same shape": (lambda a, b: torch.tanh(a * 2 + b), (a, b), True),
        "scalar": (lambda a: a * 3 - 1, (a,), True),
        "aligned slice": (lambda a: a.reshape(-1)[8:] * 3, (a,), True),
        "odd offset": (lambda a: a.reshape(-1)[1:-3] * 3, (a,), False),
        "odd count": (lambda a: a.reshape(-1)[:-1] * 3, (a,), False),
        "int and bool": (lambda a, b: torch.where(a > b, a.int(), 7) + (a < 0), (a, b), True),
    }[case]
    check(fn, *args)
    names = [d.name for p in plans for d in p.dispatches]
    assert names and all(n.endswith("v4") == vec for n in names), names


def test_independent_results_of_one_shape_share_a_kernel(plans):
    """Elementwise results into new buffers, of one shape, none reading another's, are
    one kernel (elementwise._Siblings: an optimizer step's moments); a result that reads
    one of them, another shape, and a copy into an input that reads them, come after it;
    results computed only for the graph's outputs are emitted too."""
    def f(x, y, s, w):
        a = x * 2 + 1
        b = y.exp() - x
        c = a * b                 # reads a and b: after their kernel
        d = s + 1                 # another shape
        w.copy_(a - d)            # a copy into an input, reading a sibling
        return a, b, c, d, d * 3
    x, y, w = torch.randn(5, 7), torch.randn(5, 7), torch.randn(5, 7)
    s = torch.tensor(2.0)
    check(f, x, y, s, w.clone())
    got = w.clone()
    from vk import compiled
    compiled(f)(x, y, s, got)
    f(x, y, s, w)
    torch.testing.assert_close(got, w)
    kernels = [(d.name, d.note) for d in plans[-1].dispatches]
    pair = [i for i, (n, note) in enumerate(kernels) if n.endswith("_2out") and "(5, 7)" in note]
    prod = [i for i, (n, note) in enumerate(kernels) if note == "(5, 7) <- $0 * $1"]
    assert pair and prod and pair[0] < prod[0], kernels


def test_siblings_of_alternating_shapes_wait_together(plans):
    """Siblings of several shapes, in alternating order (an optimizer step's moments, a
    parameter at a time), wait together: one kernel per shape; a result that reads one of
    them comes after their kernels."""
    a, b = [torch.randn(5, 7) for _ in range(3)], [torch.randn(11) for _ in range(3)]

    def f(a0, b0, a1, b1, a2, b2):
        out = [a0 * 2, b0 - 1, a1 * 2, b1 - 1, a2 * 2, b2 - 1]
        return out + [out[0] + out[3].sum()]
    check(f, a[0], b[0], a[1], b[1], a[2], b[2])
    names = [d.name for d in plans[-1].dispatches]
    assert names == ["elementwise:3in1d_3out"] * 2 + ["reduce:sum_f32", "elementwise:2in1d"], names


def test_siblings_keep_the_binding_limit(plans, monkeypatch):
    """Siblings past the buffers a kernel may bind start another kernel."""
    from dynamo_vulkan.lowering import elementwise
    monkeypatch.setattr(elementwise, "MAX_BUFFERS", 4)
    xs = [torch.randn(6) for _ in range(5)]
    check(lambda *xs: tuple(x * 3 - 1 for x in xs), *xs)
    counts = [d.name for d in plans[-1].dispatches]
    assert len(counts) == 3 and counts[0].endswith("_2out"), counts


def test_siblings_bind_what_the_device_allows(plans):
    """The binding limit is the device's per-stage storage buffers less one (lavapipe: 32),
    up to MAX_BUFFERS: ten results of ten inputs (20 buffers) are one kernel here."""
    from dynamo_vulkan import device
    from dynamo_vulkan.lowering import elementwise
    limit = device.device_info()["max_storage_buffers_per_stage"]
    assert elementwise.max_buffers(device.device_info()) == min(elementwise.MAX_BUFFERS, limit - 1)
    assert elementwise.max_buffers({}) == elementwise.DEFAULT_BUFFERS
    assert elementwise.max_buffers({"max_storage_buffers_per_stage": 1 << 20}) == elementwise.MAX_BUFFERS
    if limit < 21:
        pytest.skip(f"this device binds {limit} storage buffers a stage")
    xs = [torch.randn(6) for _ in range(10)]
    check(lambda *xs: tuple(x * 3 - 1 for x in xs), *xs)
    assert [d.name for d in plans[-1].dispatches] == ["elementwise:10in1d_10out"], plans[-1].dispatches


def test_an_expression_of_more_tensors_than_a_kernel_binds(plans):
    """A fused expression of 40 tensors (more than lavapipe's 32 storage buffers a stage)
    is split into kernels that each bind what the device allows, and equals eager's (it
    crashed the process, then left its output unwritten)."""
    from dynamo_vulkan import device
    from dynamo_vulkan.lowering import elementwise
    xs = [torch.randn(6) for _ in range(40)]

    def f(*xs):
        s = xs[0] * 1.5
        for x in xs[1:]:
            s = s + x
        return s
    check(f, *xs)
    limit = elementwise.max_buffers(device.device_info())
    assert all(len(set(d.bindings)) <= limit for d in plans[-1].dispatches), \
        [(d.name, len(set(d.bindings))) for d in plans[-1].dispatches]
    assert len(plans[-1].dispatches) > 1


def test_siblings_computed_for_the_outputs_alone_are_emitted(plans):
    """Results computed as the graph's outputs (three in one kernel), and the contiguous
    copies of outputs that are views, made as the plan places its outputs, wait as
    siblings like any other; the plan emits them before it ends."""
    check(lambda x, y: (x * 2, y * 3, (x - y).abs()), torch.randn(4, 9), torch.randn(4, 9))
    assert [d.name for d in plans[-1].dispatches] == ["elementwise:4in1dv4_3out"]
    check(lambda x, y: ((x * 2).t(), (y - x).t()), torch.randn(4, 9), torch.randn(4, 9))
    assert any(d.name.endswith("_2out") for d in plans[-1].dispatches), plans[-1].dispatches
