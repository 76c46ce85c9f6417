"""Real model code compiled end to end: a small CNN, an EmbeddingBag text
classifier and a GPT-2-style decoder (dynamo_vulkan/examples.py) match eager
within 1e-4 with no node on the CPU (asserted through the partition reports)."""
import torch

import dynamo_vulkan
from dynamo_vulkan.examples import GPT2, EmbeddingBagClassifier, SmallCNN
from vk import compiled


def run_and_check(model, *inputs, calls: int = 2):
    """Compile, call a few times (first call plans, later ones replay), compare with
    eager each time and require every node of every graph to be on Vulkan."""
    n = len(dynamo_vulkan.reports())
    cm = compiled(model)
    with torch.no_grad():
        expected = model(*inputs)
        for _ in range(calls):
            torch.testing.assert_close(cm(*inputs), expected, rtol=1e-4, atol=1e-4)
    reports = dynamo_vulkan.reports()[n:]
    assert reports, "nothing was compiled"
    assert all(not r.cpu_nodes for r in reports), "\n".join(map(str, reports))
    assert sum(len(r.vulkan_nodes) for r in reports) >= 5


def _randomize_bn(model):
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.normal_(0, 0.1)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.normal_(0, 0.1)


def test_small_cnn():
    torch.manual_seed(0)
    model = SmallCNN().eval()
    _randomize_bn(model)
    run_and_check(model, torch.randn(2, 3, 32, 32))


def test_small_cnn_odd_sizes_and_global_pool():
    torch.manual_seed(1)
    model = SmallCNN(channels=(3, 8, 12), classes=5, pooled=1).eval()
    _randomize_bn(model)
    run_and_check(model, torch.randn(3, 3, 19, 23))


def test_embedding_bag_classifier():
    torch.manual_seed(0)
    model = EmbeddingBagClassifier(vocab=300, dim=32, hidden=48, classes=4).eval()
    tokens = torch.randint(0, 300, (40,))
    offsets = torch.tensor([0, 7, 7, 19, 33])          # one empty text
    run_and_check(model, tokens, offsets)


def test_gpt2_decoder():
    torch.manual_seed(0)
    model = GPT2(vocab=512, dim=64, heads=4, layers=2, max_len=64).eval()
    run_and_check(model, torch.randint(0, 512, (2, 17)))


def test_gpt2_tied_head_and_single_token():
    torch.manual_seed(0)
    model = GPT2(vocab=97, dim=32, heads=2, layers=1, max_len=16).eval()
    assert model.lm_head.weight is model.wte.weight
    run_and_check(model, torch.randint(0, 97, (1, 1)))
    run_and_check(model, torch.randint(0, 97, (3, 16)))
