"""Copies that views cannot express (lowering/layout.py): padding, repeat,
flip, the *_copy view ops and diagonal/as_strided scatters."""
import pytest
import torch
import torch.nn.functional as F

from vk import check, noncontig

torch.manual_seed(0)


@pytest.mark.parametrize("pad", [(1, 2), (1, 1, 2, 0), (0, 0, 0, 0, 1, 1), (-1, 2, 1, -2)], ids=str)
def test_constant_pad(pad):
    x = torch.randn(2, 3, 4, 5)
    check(lambda x: F.pad(x, pad, value=0.5), x)
    check(lambda x: F.pad(x, pad), noncontig(x))


def test_pad_modes_and_int():
    x = torch.randn(1, 2, 5, 6)
    check(lambda x: (F.pad(x, (2, 1, 1, 2), mode="reflect"), F.pad(x, (2, 1, 1, 2), mode="replicate"),
                     F.pad(x, (2, 1, 1, 2), mode="circular")), x)
    check(lambda x: F.pad(x, (1, 1), value=7), torch.randint(0, 5, (3, 4)))
    check(lambda x: F.pad(x, (3, -3)), torch.randn(3, 4))          # everything cropped


@pytest.mark.parametrize("reps", [(2, 3), (1, 2, 1), (3,), (2, 1, 1, 2)], ids=str)
def test_repeat_and_tile(reps):
    x = torch.randn(3, 1, 4) if len(reps) >= 3 else torch.randn(3, 4) if len(reps) == 2 else torch.randn(4)
    check(lambda x: (x.repeat(reps), torch.tile(x, reps)), x)


@pytest.mark.parametrize("dims", [(0,), (1,), (0, 2), (-1,)], ids=str)
def test_flip(dims):
    x = torch.randn(3, 4, 5)
    check(lambda x: torch.flip(x, dims), x)
    check(lambda x: torch.flip(x, dims), noncontig(x))


def test_flip_rot90_roll():
    x = torch.randn(4, 5)
    check(lambda x: (torch.rot90(x), torch.fliplr(x), torch.flipud(x), torch.roll(x, 2, 1),
                     torch.roll(x, (1, -2), (0, 1))), x)
    check(lambda x: torch.flip(x, (0,)), torch.randint(0, 9, (5, 1)))


def test_view_copies():
    x = torch.randn(3, 4, 5)
    check(lambda x: (torch.permute_copy(x, (2, 0, 1)), torch.t_copy(x[0]),
                     torch.transpose_copy(x, 0, 2), torch.view_copy(x, (12, 5)),
                     torch.expand_copy(x[:, :1], (3, 4, 5)), torch.diagonal_copy(x, 0, 1, 2),
                     torch.narrow_copy(x, 1, 1, 2), torch.unsqueeze_copy(x, 1)), noncontig(x))
    check(lambda x: torch.as_strided_copy(x, (2, 2), (1, 3), 1), x)   # storage of a dense input
    check(lambda x: (torch.unbind_copy(x, 1), torch.split_with_sizes_copy(x, [1, 3], 1)), x)


def test_diagonal_and_as_strided_scatter():
    check(lambda b, s: (torch.diagonal_scatter(b, s, 1), torch.diagonal_scatter(b, s[:3], -1)),
          torch.randn(4, 5), torch.randn(4))
    check(lambda b, s: torch.as_strided_scatter(b, s, (2, 2), (1, 3), 1), torch.randn(4, 5),
          torch.randn(2, 2))
