"""minillm/model/linear.py: oneDNN's packed CPU matmul equals F.linear up to rounding, gives each row the
same result whatever the batch, follows weight changes, and steps aside for autograd."""

import copy

import pytest
import torch
import torch.nn.functional as F

from minillm.model import linear as linear_module
from minillm.model.linear import Linear

pytestmark = pytest.mark.skipif(not linear_module._ONEDNN, reason="this torch has no oneDNN")


@pytest.fixture
def layer():
    torch.manual_seed(0)
    return Linear(256, 1536, bias=True).requires_grad_(False)


def test_packed_equals_f_linear_up_to_rounding(layer):
    x = torch.randn(32, 256)
    with torch.inference_mode():
        out = layer(x)
    assert layer in linear_module._packed, "the CPU float32 call did not take the packed path"
    torch.testing.assert_close(out, F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-4)


def test_each_row_is_the_same_whatever_the_batch(layer):
    x = torch.randn(32, 256)
    with torch.inference_mode():
        whole = layer(x)
        rows = torch.cat([layer(x[i : i + 1]) for i in range(32)])
    assert torch.equal(whole, rows)


def test_a_weight_written_in_place_or_replaced_is_packed_again(layer):
    x = torch.randn(4, 256)
    layer(x)
    with torch.no_grad():
        layer.weight.mul_(2)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-4)
    layer.weight = torch.nn.Parameter(torch.randn(1536, 256), requires_grad=False)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-4)


def test_autograd_and_copies_still_work(layer):
    layer.requires_grad_(True)
    x = torch.randn(3, 256, requires_grad=True)
    layer(x).sum().backward()  # F.linear: the packed op has no backward
    assert x.grad is not None and layer.weight.grad is not None
    clone = copy.deepcopy(layer)
    assert set(clone.state_dict()) == {"weight", "bias"}
    torch.testing.assert_close(clone(x.detach()), layer(x.detach()))
