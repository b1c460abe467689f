"""Recipes as typed Python objects: the same presets, fields, JSON and checks as the C++ side."""

import json

import pytest

import scalify


def test_presets_round_trip_through_json():
    names = scalify.preset_names()
    assert names[0] == "f32" and "nvfp4" in names and "scalify_fp8_3" in names
    for name in names:
        r = scalify.preset(name)
        assert scalify.Recipe.from_json(r.to_json()).to_json() == r.to_json()


def test_fields_are_typed_and_mutable_in_place():
    r = scalify.preset("nvfp4")
    assert r.linear.forward.weight.block == (16, 16)
    assert r.linear.forward.weight.block_scale == "nvfp4"
    assert r.linear.input_grad.gradient.rounding == "stochastic"
    assert r.linear.weight_grad.activation.transform == "hadamard16"
    assert r.high_precision.last_blocks == 1
    r.linear.weight_grad.gradient.rounding = "nearest"
    r.linear.weight_grad.activation.transform = "none"
    r.linear.weight_grad.gradient.transform = "none"
    r.high_precision.last_blocks = 0
    r.validate()
    j = json.loads(r.to_json())
    assert "rounding" not in j["linear"]["weight_grad"]["gradient"]
    assert "high_precision" not in j


def test_a_recipe_built_from_fields():
    c = scalify.QuantizerConfig()
    c.scaling, c.format = "current", "e5m2"
    r = scalify.Recipe()
    r.name = "e5m2_everywhere"
    r.linear = scalify.LinearRecipe.uniform(c, c, c)
    r.validate()
    assert scalify.Recipe.from_json(r.to_json()).linear == r.linear


def test_refusals_name_what_clashes():
    r = scalify.preset("nvfp4")
    r.linear.forward.activation.transform = "hadamard16"
    with pytest.raises(ValueError, match="weight-gradient GEMM's operands only"):
        r.validate()
    with pytest.raises(ValueError, match="unknown recipe preset 'fp9'"):
        scalify.preset("fp9")
    with pytest.raises(ValueError, match="scaling"):
        scalify.QuantizerConfig().scaling = "sideways"


def test_gradient_communication_is_part_of_the_recipe():
    r = scalify.preset("f32_allreduce_e4m3")
    assert r.gradient_allreduce == "e4m3"
    assert json.loads(r.to_json())["gradient_allreduce"] == "e4m3"
    assert scalify.preset("f32").gradient_allreduce is None
    assert "gradient_allreduce" not in json.loads(scalify.preset("f32").to_json())  # earlier recipes' JSON unchanged
    r.gradient_allreduce = None
    assert r.to_json() == scalify.Recipe.from_json(r.to_json()).to_json()
    r.gradient_allreduce = "e2m1"
    with pytest.raises(ValueError, match="gradient_allreduce must be f16, bf16, e4m3 or e5m2"):
        r.validate()
