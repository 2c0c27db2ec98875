"""Prepacked (oneDNN) linear layers compute what F.linear computes, at every batch size the engine uses."""

import pytest
import torch
import torch.nn.functional as F

from common.linear import (
    Linear,
    onednn_available,
    pack_linear_layers,
    padded_rows,
    row_buckets,
    warm_up_linears,
)


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
