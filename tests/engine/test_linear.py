"""Prepacked (oneDNN) linear layers compute what F.linear computes, at every batch size the engine uses."""

import pytest
import torch
import torch.nn.functional as F

from common.linear import (
    Linear,
    amx_available,
    onednn_available,
    pack_linear_layers,
    padded_rows,
    row_buckets,
    warm_up_linears,
)
from common.native_kernels import native_op


@pytest.mark.parametrize("rows", [1, 5, 33, 300])
@pytest.mark.parametrize("with_bias", [False, True])
def test_onednn_matches_f_linear_in_float32(rows, with_bias):
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 64, generator=gen)
    bias = torch.randn(96, generator=gen) if with_bias else None
    x = torch.randn(rows, 64, generator=gen)
    layer = Linear(weight, bias, backend="onednn")
    assert layer.backend == "onednn"
    torch.testing.assert_close(layer(x), F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not onednn_available(torch.zeros(1, 1, dtype=torch.bfloat16)), reason="no native bf16")
def test_onednn_matches_f_linear_in_bfloat16():
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(128, 64, generator=gen).bfloat16()
    x = torch.randn(7, 64, generator=gen).bfloat16()
    got = Linear(weight, backend="onednn")(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), F.linear(x, weight).float(), rtol=2e-2, atol=2e-2)


def test_row_counts_are_padded_to_few_buckets_with_little_padding():
    assert [padded_rows(r) for r in (1, 7, 32, 33, 48, 49, 512, 513)] == [1, 7, 32, 48, 48, 64, 512, 576]
    buckets = row_buckets(512)
    assert buckets[:32] == list(range(1, 33)) and buckets[-1] == 512 and len(buckets) == 32 + 30
    for rows in range(1, 1025):
        assert rows <= padded_rows(rows) <= max(rows * 1.5, rows + 15)
        assert padded_rows(rows) in row_buckets(1024)


@pytest.mark.parametrize("rows", [33, 47, 300])
def test_padded_products_return_the_rows_asked_for_and_their_values(rows):
    gen = torch.Generator().manual_seed(rows)
    weight, bias = torch.randn(40, 24, generator=gen), torch.randn(40, generator=gen)
    x = torch.randn(rows, 24, generator=gen)
    got = Linear(weight, bias, backend="onednn")(x)
    assert got.shape == (rows, 40)
    torch.testing.assert_close(got, F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)


def test_warm_up_runs_every_bucket_of_each_live_layer_shape_once():
    from common.linear import _SHAPES

    layers = [Linear(torch.randn(24, 20), backend="onednn"), Linear(torch.randn(24, 20), backend="onednn")]
    other = Linear(torch.randn(12, 20), torch.randn(12), backend="onednn")
    shapes = {(24, 20, torch.float32, False), (12, 20, torch.float32, True)}
    assert shapes <= set(_SHAPES.keys())
    assert warm_up_linears(40) == len(_SHAPES) * len(row_buckets(40))  # 1..32 and 48, per shape
    del layers, other


def test_warm_up_runs_a_capped_shape_only_up_to_its_cap():
    from common.linear import _SHAPES

    head = Linear(torch.randn(40, 20), backend="onednn")
    body = Linear(torch.randn(28, 20), backend="onednn")
    others = len(_SHAPES) - 1
    assert warm_up_linears(100, {head: 8}) == others * len(row_buckets(100)) + 8  # the head at 1..8 rows
    del head, body


def test_non_contiguous_input_is_accepted():
    weight = torch.randn(16, 8)
    x = torch.randn(8, 6).t()  # [6, 8], a transposed view
    torch.testing.assert_close(Linear(weight, backend="onednn")(x), F.linear(x, weight))


def test_auto_picks_torch_where_onednn_cannot_run_and_unknown_backends_are_refused():
    half = torch.randn(4, 4, dtype=torch.float16)
    assert Linear(half, backend="auto").backend == "torch"
    with pytest.raises(ValueError, match="onednn"):
        Linear(half, backend="onednn")
    with pytest.raises(ValueError, match="unknown linear backend"):
        Linear(torch.randn(4, 4), backend="fast")


def test_pack_linear_layers_swaps_every_linear_of_a_module_and_keeps_its_output():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Sequential(torch.nn.Linear(16, 4, bias=False))
    ).eval()
    x = torch.randn(2, 5, 8)  # leading dimensions, as a transformer's [batch, tokens, hidden]
    with torch.no_grad():
        expected = model(x)
        assert pack_linear_layers(model) == 2
        assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
        torch.testing.assert_close(model(x), expected, rtol=1e-5, atol=1e-5)


AMX = pytest.mark.skipif(
    not amx_available(torch.zeros(32, 32, dtype=torch.bfloat16)), reason="no AMX tiles on this CPU"
)


@AMX
@pytest.mark.parametrize("rows", [1, 3, 15, 16, 17, 32, 33, 64, 200])
@pytest.mark.parametrize("shape", [(64, 32), (96, 576), (576, 1536)])
def test_amx_matches_f_linear_in_bfloat16(rows, shape):
    """Every row count a decode batch or a prefill chunk brings: one partial tile of rows, whole groups of
    16, padded groups, more than the two groups a pass holds. Both sides exact bfloat16 products summed in
    float32 in different orders, so within a bfloat16 rounding of the output."""
    gen = torch.Generator().manual_seed(rows * shape[0])
    weight = (torch.randn(*shape, generator=gen) * 0.05).bfloat16()
    x = torch.randn(rows, shape[1], generator=gen).bfloat16()
    layer = Linear(weight, backend="amx")
    got = layer(x)
    expected = x.float() @ weight.float().T
    assert got.dtype == torch.bfloat16 and got.shape == (rows, shape[0])
    torch.testing.assert_close(got.float(), expected, rtol=8e-3, atol=8e-3 * expected.abs().max().item())


@AMX
@pytest.mark.parametrize("rows", [1, 3, 16, 17, 33, 64, 200])
@pytest.mark.parametrize("shape", [(96, 64), (3072, 576)])
def test_amx_gated_activation_has_the_bits_of_the_product_then_silu_and_mul(rows, shape):
    """The one-pass [gate; up] product and activation (an odd number of 16-channel blocks in the first shape,
    SmolLM2's MLP in the second) against the product followed by the native silu_and_mul, bit for bit."""
    ops = native_op("silu_and_mul")
    gen = torch.Generator().manual_seed(rows + shape[0])
    weight = (torch.randn(*shape, generator=gen) * 0.05).bfloat16()
    x = torch.randn(rows, shape[1], generator=gen).bfloat16()
    layer = Linear(weight, backend="amx")
    product = layer(x)
    expected = torch.empty(rows, shape[0] // 2, dtype=torch.bfloat16)
    ops.silu_and_mul(product, expected)
    got = layer.silu_and_mul(x)
    assert got.shape == expected.shape and torch.equal(got.view(torch.int16), expected.view(torch.int16))
    assert layer.silu_and_mul(x[:0]).shape == (0, shape[0] // 2)


@AMX
def test_only_amx_layers_without_a_bias_run_the_gated_activation_in_one_pass():
    weight = torch.randn(64, 96).bfloat16()
    x = torch.randn(4, 96).bfloat16()
    assert Linear(weight, backend="amx").silu_and_mul(x) is not None
    assert Linear(weight, torch.randn(64).bfloat16(), backend="amx").silu_and_mul(x) is None
    assert Linear(weight, backend="onednn").silu_and_mul(x) is None


@AMX
def test_amx_is_auto_for_bfloat16_and_adds_the_bias_and_refuses_odd_shapes():
    gen = torch.Generator().manual_seed(5)
    weight = torch.randn(64, 96, generator=gen).bfloat16()
    bias = torch.randn(64, generator=gen).bfloat16()
    x = torch.randn(5, 96, generator=gen).bfloat16().t().contiguous().t()  # a contiguous copy is taken
    layer = Linear(weight, bias, backend="auto")
    assert layer.backend == "amx" and layer.weight.shape == (4, 48, 32)
    torch.testing.assert_close(layer(x).float(), F.linear(x, weight, bias).float(), rtol=2e-2, atol=5e-2)
    assert layer(x[:0]).shape == (0, 64)
    assert (
        Linear(torch.randn(40, 96).bfloat16(), backend="auto").backend == "onednn"
    )  # 40 channels: not whole pairs of 16
    assert Linear(torch.randn(64, 96), backend="auto").backend == "onednn"  # float32
    with pytest.raises(ValueError, match="amx"):
        Linear(torch.randn(40, 96).bfloat16(), backend="amx")
