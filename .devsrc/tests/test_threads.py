"""Compiled functions called from several Python threads at once give eager's results:
programs share the device's temporaries and their staging memory, so calls are
serialised (runtime/program.RUN_LOCK) rather than racing on them."""
from concurrent.futures import ThreadPoolExecutor

import torch

import dynamo_vulkan
from vk import compiled


def _softmax_tanh_sum(x):
    return torch.softmax(x, -1).tanh().sum(-1) + x.mean()


def _mlp(x, w1, w2):
    return torch.relu(x @ w1) @ w2


def _all_vulkan(n_reports: int) -> None:
    reports = dynamo_vulkan.reports()[n_reports:]
    assert reports and not [n for r in reports for n in r.cpu_nodes]


def test_one_function_from_many_threads():
    fn = compiled(_softmax_tanh_sum)
    n = len(dynamo_vulkan.reports())
    fn(torch.randn(16, 1000))                     # compiled once, before the threads start
    _all_vulkan(n)
    inputs = [torch.randn(16, 1000) * (1 + i % 5) for i in range(200)]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(fn, inputs))
    wrong = [i for i, (x, got) in enumerate(zip(inputs, results))
             if not torch.allclose(got, _softmax_tanh_sum(x), rtol=1e-5, atol=1e-6)]
    assert not wrong, f"{len(wrong)} of {len(inputs)} threaded calls differ from eager"


def test_several_models_from_several_threads():
    """Two graphs of different shapes (their programs share temporaries), two threads
    each, some calls compiling a new shape while others run."""
    torch.manual_seed(0)
    w1, w2 = torch.randn(40, 72), torch.randn(72, 24)
    f, g = compiled(_softmax_tanh_sum), compiled(_mlp)
    jobs = []
    for i in range(120):
        if i % 2:
            x = torch.randn(3 + i % 3, 40)
            jobs.append((lambda x=x: g(x, w1, w2), _mlp(x, w1, w2)))
        else:
            x = torch.randn(5, 17 + i % 2)
            jobs.append((lambda x=x: f(x), _softmax_tanh_sum(x)))
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda job: job[0](), jobs))
    wrong = [i for i, (got, (_, want)) in enumerate(zip(results, jobs))
             if not torch.allclose(got, want, rtol=1e-4, atol=1e-4)]
    assert not wrong, f"{len(wrong)} of {len(jobs)} threaded calls differ from eager"
