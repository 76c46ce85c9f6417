"""View ops (lowering/views.py) as metadata, and clone/copy materialising them."""
import torch

from vk import check, noncontig

torch.manual_seed(0)


def test_view_chain():
    check(lambda x: x.view(3, 4, 2).permute(2, 0, 1).transpose(0, 2)[1:, ::2].unsqueeze(0).squeeze(0) * 1,
          torch.randn(24))


def test_reshape_of_transposed_copies():
    check(lambda x: x.t().reshape(-1) + 1, torch.randn(3, 5))


def test_expand_select_slice_clone():
    x = torch.randn(3, 1, 5)
    check(lambda t: (t.expand(3, 4, 5).clone(), t[:, 0, 2:4].contiguous(), t.select(2, -1) + 0,
                     t.squeeze(1).narrow(1, 1, 3) * 2), x)


def test_noncontiguous_input_and_view_outputs():
    x = noncontig(torch.randn(4, 6))
    check(lambda t: (t + 1).t(), x)


def test_copy_and_to_dtype():
    x = torch.randn(4, 5)
    check(lambda t: (t.to(torch.int64) + 1, t.clone(memory_format=torch.contiguous_format),
                     t.t().contiguous()), x)
