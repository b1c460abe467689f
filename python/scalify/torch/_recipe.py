"""The recipe a torch layer runs: a preset name, a Recipe or a LinearRecipe, as one LinearRecipe."""

from __future__ import annotations

from typing import Union

from .._recipes import preset
from .._scalify import LinearRecipe, Recipe

RecipeLike = Union[str, Recipe, LinearRecipe]


def as_recipe(recipe: RecipeLike) -> Recipe:
    """A Recipe from a preset name or a Recipe (a LinearRecipe becomes a recipe with only it)."""
    if isinstance(recipe, str):
        return preset(recipe)
    if isinstance(recipe, Recipe):
        recipe.validate()
        return recipe
    if isinstance(recipe, LinearRecipe):
        whole = Recipe()
        whole.name = "custom"
        whole.linear = recipe
        # SCALIFY's operands propagate their scales: a recipe of it keeps scaled state.
        roles = [recipe.forward.activation, recipe.forward.weight, recipe.input_grad.gradient, recipe.input_grad.weight,
                 recipe.weight_grad.activation, recipe.weight_grad.gradient]
        whole.scaled_state = any(r.scaling == "scalify" for r in roles)
        whole.validate()
        return whole
    raise TypeError(f"recipe: needs a preset name, a scalify.Recipe or a scalify.LinearRecipe, not {type(recipe).__name__}")
