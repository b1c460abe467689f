"""The optimizer-state roles (issue 48) in Python: typed attributes (StateFormat per moment,
master_rounding by name), set by keyword or in place, refused by name when bad, and kept by the
recipe's JSON, equality, repr and pickling."""

import copy
import json
import os
import pickle
import subprocess
import sys
import textwrap

import pytest

import scalify
from scalify import Recipe


def test_state_presets_carry_their_moments_through_json_repr_and_pickle():
    for name in ("msamp_o2", "coat", "fp8_adam_no_expansion"):
        r = Recipe.preset(name)
        fields = json.loads(r.to_json())
        assert fields["first_moment"]["storage"] == "e4m3", name
        assert eval(repr(r), vars(scalify)) == r, name
        assert pickle.loads(pickle.dumps(r)) == r, name
    coat = json.loads(Recipe.preset("coat").to_json())
    assert coat["second_moment"] == {
        "storage": "e4m3",
        "scaling": "per_group",
        "group_size": 128,
        "rounding": "nearest_even",
        "non_negative": True,
        "expand": True,
        "expand_min": 16,
    }
    assert Recipe.preset("coat") != Recipe.preset("fp8_adam_no_expansion")


# The roles as typed attributes: a StateFormat per moment, master_rounding a name.
def test_state_roles_are_typed_attributes_with_the_presets_choices():
    ms = Recipe.preset("msamp_o2")
    assert isinstance(ms.first_moment, scalify.StateFormat)
    assert (ms.first_moment.storage, ms.first_moment.scaling, ms.first_moment.non_negative) == ("e4m3", "per_tensor", False)
    assert (ms.second_moment.storage, ms.second_moment.scaling, ms.second_moment.non_negative) == ("f16", "per_tensor", True)
    coat = Recipe.preset("coat").second_moment
    assert (coat.storage, coat.scaling, coat.group_size, coat.rounding) == ("e4m3", "per_group", 128, "nearest_even")
    assert (coat.non_negative, coat.expand, coat.expand_min) == (True, True, 16)
    assert Recipe.preset("fp8_adam_no_expansion").first_moment.expand is False
    f32 = Recipe()
    assert f32.first_moment == scalify.StateFormat() and f32.master_rounding == "nearest_even"
    assert (f32.first_moment.storage, f32.first_moment.scaling) == ("f32", "none")


def test_state_roles_set_by_keyword_and_in_place_reach_the_json():
    m = scalify.StateFormat(storage="e5m2", scaling="per_group", group_size=32, rounding="stochastic")
    r = Recipe(name="mine", master_weight="bf16", master_rounding="stochastic", first_moment=m)
    r.second_moment.storage = "e4m3"
    r.second_moment.scaling = "per_group"
    r.second_moment.non_negative = True
    r.second_moment.expand = True
    r.second_moment.expand_min = 8
    fields = json.loads(r.to_json())
    assert fields["first_moment"] == {"storage": "e5m2", "scaling": "per_group", "group_size": 32, "rounding": "stochastic",
                                      "non_negative": False}
    assert fields["second_moment"] == {"storage": "e4m3", "scaling": "per_group", "group_size": 128, "rounding": "nearest_even",
                                       "non_negative": True, "expand": True, "expand_min": 8}
    assert fields["master_rounding"] == "stochastic"
    r.validate()
    assert Recipe.from_json(r.to_json()) == r
    assert r.first_moment == m and r.first_moment is not m  # the recipe holds its own copy
    m.group_size = 64
    assert r.first_moment.group_size == 32


def test_state_format_repr_equality_and_pickle():
    f = scalify.StateFormat(storage="e4m3", scaling="per_tensor")
    assert repr(f) == "StateFormat(storage='e4m3', scaling='per_tensor')"
    assert repr(scalify.StateFormat()) == "StateFormat()"
    assert eval(repr(f), vars(scalify)) == f
    assert f != scalify.StateFormat(storage="e4m3", scaling="per_group") and f != "e4m3" and f.__eq__(3) is NotImplemented
    for twin in (pickle.loads(pickle.dumps(f)), copy.deepcopy(f), copy.copy(f)):
        assert twin == f
    twin = copy.deepcopy(f)
    twin.storage = "e5m2"
    assert f.storage == "e4m3"
    with pytest.raises(TypeError):
        hash(f)
    # A recipe's repr names its state roles as keywords (no JSON fallback), and evaluates back.
    text = repr(Recipe.preset("msamp_o2"))
    assert text.startswith("Recipe(name='msamp_o2'"), text
    assert "first_moment=StateFormat(storage='e4m3', scaling='per_tensor')" in text
    assert "second_moment=StateFormat(storage='f16', scaling='per_tensor', non_negative=True)" in text
    r = Recipe(master_weight="bf16", master_rounding="stochastic")
    assert repr(r) == "Recipe(master_weight='bf16', master_rounding='stochastic')"
    assert eval(repr(r), vars(scalify)) == r


@pytest.mark.parametrize("field, value, words", [
    ("storage", "e2m1", "StateFormat.storage: storage must be one of f32, bf16, f16, e4m3, e5m2, got e2m1"),
    ("storage", "e9m9", "StateFormat.storage: unknown number format 'e9m9'"),
    ("scaling", "per_channel", "StateFormat.scaling must be none, per_tensor or per_group, got 'per_channel'"),
    ("group_size", 0, r"StateFormat.group_size must be in \[1, 1073741824\], got 0"),
    ("group_size", 1 << 31, r"StateFormat.group_size must be in \[1, 1073741824\], got 2147483648"),
    ("rounding", "toward_zero", "StateFormat.rounding: rounding must be nearest_even or stochastic"),
    ("expand_min", -1, r"StateFormat.expand_min must be in \[1, 1048576\], got -1"),
])
def test_bad_state_values_are_value_errors_naming_the_field(field, value, words):
    f = scalify.StateFormat()
    with pytest.raises(ValueError, match=words):
        setattr(f, field, value)
    assert f == scalify.StateFormat()  # unchanged by the refusal
    with pytest.raises(ValueError, match=words):
        scalify.StateFormat(**{field: value})


def test_wrong_types_and_unknown_keywords_are_type_errors():
    with pytest.raises(TypeError):
        scalify.StateFormat(group_size="128")
    with pytest.raises(TypeError, match="grup_size"):
        scalify.StateFormat(grup_size=128)
    with pytest.raises(TypeError):
        Recipe().first_moment = "e4m3"
    with pytest.raises(ValueError, match="Recipe.master_rounding must be nearest_even or stochastic, got 'toward_zero'"):
        Recipe().master_rounding = "toward_zero"


def test_fields_the_format_would_ignore_are_refused_by_name():
    ms = Recipe.preset("msamp_o2")
    ms.first_moment.group_size = 64
    with pytest.raises(ValueError, match="first_moment: group_size 64 applies only to per_group scaling, and scaling is per_tensor"):
        ms.validate()
    ablation = Recipe.preset("fp8_adam_no_expansion")
    ablation.second_moment.expand_min = 8
    with pytest.raises(ValueError, match="second_moment: expand_min 8 applies only with the expansion"):
        ablation.validate()
    fields = json.loads(Recipe.preset("msamp_o2").to_json())
    fields["first_moment"]["group_size"] = 128
    with pytest.raises(ValueError, match="field 'group_size' in first_moment applies only to per_group scaling"):
        Recipe.from_json(json.dumps(fields))
    # Inconsistent fields together are Recipe.validate()'s to refuse, naming the role.
    r = Recipe(first_moment=scalify.StateFormat(storage="e4m3"))
    with pytest.raises(ValueError, match="first_moment: e4m3 storage needs a scale"):
        r.validate()


def test_the_stubs_type_the_state_roles(tmp_path):
    pytest.importorskip("mypy")
    code = textwrap.dedent("""
        import scalify

        f: scalify.StateFormat = scalify.Recipe.preset("coat").second_moment
        n: int = f.group_size
        s: str = f.storage
        b: bool = f.non_negative and f.expand
        r = scalify.Recipe(first_moment=scalify.StateFormat(storage="e4m3", scaling="per_tensor"), master_rounding="nearest_even")
        r.second_moment = f
        r.second_moment.expand_min = 8
        reveal_type(r.first_moment)
        reveal_type(f.expand_min)
    """)
    path = tmp_path / "user_code.py"
    path.write_text(code)
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(scalify.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([package_parent, os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--cache-dir", str(tmp_path / "cache"),
                          str(path)], capture_output=True, text=True, cwd=tmp_path, env=env)
    out = (run.stdout + run.stderr).replace("builtins.", "")
    assert run.returncode == 0, out
    assert 'Revealed type is "scalify._scalify.StateFormat"' in out
    assert 'Revealed type is "int"' in out
