"""The optimizer-state roles (issue 48) reach Python through the recipe's JSON: presets, equality,
repr and pickling keep them."""

import json
import pickle

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
