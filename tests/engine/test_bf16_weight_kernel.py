"""The bfloat16-weight linear kernel (worker/kernels/bf16_weight_linear.cpp) and its layer
(common/linear.py): float32 arithmetic on weights stored in bfloat16, so the result is x times the
bf16-rounded weights, to float32 summation error."""

import pytest
import torch

from common.linear import Bf16WeightLinear, bf16_weight_layers, bf16_weight_ops


def kernel():
    ops = bf16_weight_ops()
    if ops is None:
        pytest.skip("native kernels not built (make kernels)")
    return ops


# Rows: every tile of the kernel (1-4), remainders and chunks; widths: a multiple of 16, one leaving 8, one
# leaving a scalar tail; outputs: even (weight rows in pairs) and odd (one row left over).
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 12, 17, 33])
@pytest.mark.parametrize(("in_features", "out_features"), [(384, 1536), (24, 7), (1539, 64)])
def test_kernel_is_float32_x_times_the_bf16_weights(rows, in_features, out_features):
    ops = kernel()
    gen = torch.Generator().manual_seed(rows * 1000 + in_features)
    x = torch.randn(rows, in_features, generator=gen)
    w = torch.randn(out_features, in_features, generator=gen).bfloat16()
    out = torch.full((rows, out_features), float("nan"))
    ops.bf16_weight_linear(x, w, out)
    expected = x.double() @ w.double().T
    scale = x.double().abs() @ w.double().abs().T  # what float32 summation error grows with
    assert bool(torch.isfinite(out).all())
    assert float(((out.double() - expected).abs() / scale).max()) < 1e-6


def test_layer_adds_the_bias_and_swaps_a_modules_linears():
    kernel()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 48), torch.nn.GELU(), torch.nn.Linear(48, 8, bias=False)
    ).eval()
    x = torch.randn(2, 5, 32)  # leading dimensions, as a transformer's [batch, tokens, hidden]
    with torch.no_grad():
        rounded = torch.nn.Sequential(*[m for m in model]).eval()
        expected = torch.nn.functional.linear(
            torch.nn.functional.gelu(
                torch.nn.functional.linear(x, model[0].weight.bfloat16().float(), model[0].bias)
            ),
            model[2].weight.bfloat16().float(),
        )
        assert bf16_weight_layers(rounded) == 2
        assert not any(isinstance(m, torch.nn.Linear) for m in rounded.modules())
        torch.testing.assert_close(rounded(x), expected, rtol=1e-5, atol=1e-5)
    layer = Bf16WeightLinear(torch.randn(4, 16), torch.arange(4.0))
    assert layer.weight.dtype == torch.bfloat16
    zeros = layer(torch.zeros(3, 16))
    assert torch.equal(zeros, torch.arange(4.0).expand(3, 4))


def test_kernel_refuses_other_dtypes_and_shapes():
    ops = kernel()
    x, out = torch.randn(2, 16), torch.empty(2, 4)
    with pytest.raises(RuntimeError, match="bfloat16 weights"):
        ops.bf16_weight_linear(x, torch.randn(4, 16), out)
    with pytest.raises(RuntimeError, match="shapes differ"):
        ops.bf16_weight_linear(x, torch.randn(4, 8).bfloat16(), out)
