"""Recipe objects behave as Python values: keyword constructors, documented fields, ==, repr, pickle
and deepcopy; block sizes the engine cannot honour are refused."""

import copy
import pickle
import re

import pytest

import scalify
from scalify import (ForwardGemm, HighPrecisionLayers, InputGradGemm, LinearRecipe, QuantizerConfig, Recipe, StateFormat,
                     WeightGradGemm)


def test_keyword_constructors_set_every_field_given_and_keep_the_defaults():
    q = QuantizerConfig(format="e5m2", scaling="delayed", margin=2, history=8, reduce="most_recent", update_interval=3, bias=1,
                        block=(1, 32), block_scale="mx_ceil", rounding="stochastic", saturate=False, transform="hadamard16")
    assert (q.format, q.scaling, q.margin, q.history, q.reduce, q.update_interval, q.bias) == (
        "e5m2", "delayed", 2, 8, "most_recent", 3, 1)
    assert (q.block, q.block_scale, q.rounding, q.saturate, q.transform) == ((1, 32), "mx_ceil", "stochastic", False, "hadamard16")
    default = QuantizerConfig()
    only_format = QuantizerConfig(format="e2m1")
    assert only_format.format == "e2m1" and only_format.scaling == default.scaling and only_format.block == default.block
    g = ForwardGemm(activation=only_format)
    assert g.activation == only_format and g.weight == default
    assert InputGradGemm(gradient=q).gradient == q and WeightGradGemm(gradient=q).gradient == q
    lin = LinearRecipe(quantized=True, forward=g)
    assert lin.quantized and lin.forward == g and lin.input_grad == InputGradGemm()
    hp = HighPrecisionLayers(last_blocks=1, layers=["*.attn.qkv"])
    assert (hp.first_blocks, hp.last_blocks, hp.layers) == (0, 1, ["*.attn.qkv"])
    r = Recipe(name="mine", linear=lin, high_precision=hp, master_weight="bf16", data_storage="bf16", gradient_allreduce="e5m2")
    assert (r.name, r.master_weight, r.data_storage, r.gradient_allreduce) == ("mine", "bf16", "bf16", "e5m2")
    assert r.linear == lin and r.high_precision == hp and r.optimizer_state == Recipe().optimizer_state


@pytest.mark.parametrize("cls, known, typo", [(QuantizerConfig, dict(format="e5m2"), dict(fromat="e5m2")),
                                              (ForwardGemm, dict(weight=QuantizerConfig()), dict(gradient=QuantizerConfig())),
                                              (LinearRecipe, dict(quantized=True), dict(quantised=True)),
                                              (HighPrecisionLayers, dict(last_blocks=1), dict(last=1)),
                                              (StateFormat, dict(storage="e4m3"), dict(stroage="e4m3")),
                                              (Recipe, dict(name="x"), dict(nmae="x"))])
def test_a_known_keyword_is_taken_and_an_unknown_one_is_a_type_error(cls, known, typo):
    made = cls(**known)
    assert all(getattr(made, k) == v for k, v in known.items())
    with pytest.raises(TypeError, match=list(typo)[0]):
        cls(**typo)


def test_a_bad_value_given_as_a_keyword_is_the_setters_value_error():
    with pytest.raises(ValueError, match="unknown number format 'e9m9'"):
        QuantizerConfig(format="e9m9")
    with pytest.raises(ValueError, match="unknown scaling strategy"):
        QuantizerConfig(scaling="sometimes")


def allowed_names(error_text):
    """The names a parser lists in its error (quoted or not, aliases in parentheses dropped)."""
    listed = re.split(r"valid(?: [a-z]+)?: |must be |; ", error_text)[-1].rstrip(")")
    listed = re.sub(r"\([^)]*\)", "", listed).replace(" or ", ", ").split(", got")[0]
    return [n.strip(" '") for n in listed.split(",") if n.strip(" '")]


# Each field's docstring names every value its setter accepts: the setter's own error lists them.
@pytest.mark.parametrize("cls, field", [(QuantizerConfig, "scaling"), (QuantizerConfig, "format"), (QuantizerConfig, "block_scale"),
                                        (QuantizerConfig, "rounding"), (QuantizerConfig, "reduce"), (QuantizerConfig, "transform"),
                                        (Recipe, "master_weight"), (Recipe, "optimizer_state"), (Recipe, "weight_gradient"),
                                        (Recipe, "linear_master_weight"),
                                        (StateFormat, "scaling")])
def test_each_fields_docstring_lists_the_values_its_parser_accepts(cls, field):
    with pytest.raises(ValueError) as bad:
        setattr(cls(), field, "no-such-name")
    names = allowed_names(str(bad.value))
    assert len(names) >= 2, str(bad.value)
    doc = getattr(cls, field).__doc__
    for name in names:
        assert re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", doc), (field, name, doc)


def test_every_field_has_a_docstring():
    for cls in (QuantizerConfig, ForwardGemm, InputGradGemm, WeightGradGemm, LinearRecipe, HighPrecisionLayers, StateFormat, Recipe):
        fields = [n for n, v in vars(cls).items() if isinstance(v, property)]
        assert fields, cls
        for f in fields:  # a sentence, not nanobind's generated signature "(self) -> int"
            doc = getattr(cls, f).__doc__
            assert doc and not doc.startswith("(self)"), f"{cls.__name__}.{f}: {doc!r}"


def test_repr_shows_the_changed_fields_and_evaluates_back():
    q = QuantizerConfig(format="e5m2", block=(1, 32))
    assert repr(q) == "QuantizerConfig(format='e5m2', block=(1, 32))"
    assert repr(QuantizerConfig()) == "QuantizerConfig()"
    for name in scalify.preset_names():
        r = Recipe.preset(name)
        assert eval(repr(r), vars(scalify)) == r, name
    assert repr(Recipe.preset("current")).startswith("Recipe(name='current', linear=LinearRecipe(quantized=True")


def test_equality_is_by_value_and_other_types_are_not_equal():
    assert QuantizerConfig(format="e5m2") == QuantizerConfig(format="e5m2")
    assert QuantizerConfig(format="e5m2") != QuantizerConfig()
    assert QuantizerConfig() != "QuantizerConfig()" and Recipe() != 0 and not (LinearRecipe() == None)  # noqa: E711
    assert QuantizerConfig().__eq__(3) is NotImplemented
    with pytest.raises(TypeError):
        hash(QuantizerConfig())  # mutable: unhashable, as list and dict


@pytest.mark.parametrize("name", ["nvfp4", "f16_loss_scaled", "scalify_fp8_4", "f32_allreduce_e4m3"])
def test_recipes_pickle_and_deep_copy_to_equal_independent_objects(name):
    r = Recipe.preset(name)
    for twin in (pickle.loads(pickle.dumps(r)), copy.deepcopy(r), copy.copy(r)):
        assert twin == r and twin.to_json() == r.to_json()
    twin = copy.deepcopy(r)
    before = r.linear.forward.activation.format
    twin.linear.forward.activation.format = "e5m2" if before != "e5m2" else "e4m3"
    twin.high_precision.first_blocks = 3
    assert r.linear.forward.activation.format == before and r.high_precision.first_blocks == 0
    assert twin != r


def test_small_objects_pickle_and_deep_copy_independently():
    q = QuantizerConfig(format="e2m1", scaling="block", block=(16, 16), block_scale="nvfp4", reduce="most_recent")
    objects = [q, ForwardGemm(weight=q), InputGradGemm(gradient=q), WeightGradGemm(activation=q),
               LinearRecipe(quantized=True, weight_grad=WeightGradGemm(gradient=q)), HighPrecisionLayers(layers=["h0.*"])]
    for o in objects:
        assert pickle.loads(pickle.dumps(o)) == o and copy.deepcopy(o) == o, repr(o)
    lin = objects[4]
    twin = copy.deepcopy(lin)
    twin.weight_grad.gradient.block = (1, 16)
    assert lin.weight_grad.gradient.block == (16, 16)
    hp = objects[5]
    twin_hp = copy.deepcopy(hp)
    twin_hp.layers = ["other"]
    assert hp.layers == ["h0.*"]


def test_nested_fields_change_in_place_through_their_parent():
    r = Recipe.preset("current")
    r.linear.forward.activation.format = "e5m2"
    r.linear.input_grad.gradient.block = (1, 64)
    assert r.linear.forward.activation.format == "e5m2" and r.linear.input_grad.gradient.block == (1, 64)
    assert '"format": "e5m2"' in r.to_json()


def test_an_empty_block_is_refused_when_set():
    q = QuantizerConfig()
    for block in [(0, 32), (1, 0), (1, 4097)]:
        with pytest.raises(ValueError, match=r"block must be \[rows, cols\] with each in \[1, 4096\]"):
            q.block = block
        with pytest.raises(ValueError, match="block must be"):
            QuantizerConfig(block=block)
    assert q.block == QuantizerConfig().block  # unchanged by the refusals


def test_validate_refuses_blocks_the_engine_cannot_honour():
    mx = Recipe.preset("mxfp8")
    mx.linear.forward.weight.block = (1, 7)
    with pytest.raises(ValueError, match=r"linear.forward.weight: MX blocks are 32 elements: .* got \[1, 7\]"):
        mx.validate()
    with pytest.raises(ValueError, match="MX blocks are 32 elements"):  # a JSON recipe gets the same check
        Recipe.from_json(mx.to_json()).validate()
    mx.linear.forward.weight.block = (32, 1)
    mx.validate()
    nv = Recipe.preset("nvfp4")
    nv.linear.forward.activation.block = (1, 32)
    with pytest.raises(ValueError, match=r"NVFP4 blocks are 16 elements: .* got \[1, 32\]"):
        nv.validate()
    for name in scalify.preset_names():
        Recipe.preset(name).validate()


def test_linear_master_weight_is_a_typed_field_that_msamp_o2_sets():
    assert Recipe.preset("msamp_o2").linear_master_weight == "scaled_f16"
    assert Recipe.preset("coat").linear_master_weight == "master_weight"
    r = Recipe(name="mine", linear=Recipe.preset("delayed").linear, linear_master_weight="scaled_f16")
    assert r.linear_master_weight == "scaled_f16"
    assert Recipe.from_json(r.to_json()).linear_master_weight == "scaled_f16"
    assert "linear_master_weight='scaled_f16'" in repr(r)
    assert "linear_master_weight" not in Recipe.preset("delayed").to_json()  # written only when set
    with pytest.raises(ValueError, match="master_weight or scaled_f16, got 'f16'"):
        r.linear_master_weight = "f16"
    with pytest.raises(TypeError):
        Recipe(linear_master_weight=16)  # type: ignore[arg-type]
    scaled = Recipe.preset("scalify_fp8_4")
    scaled.linear_master_weight = "scaled_f16"
    with pytest.raises(ValueError, match="with scaled_state SCALIFY's scaled master weights already carry their own scales"):
        scaled.validate()
