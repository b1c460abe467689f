"""Recipes by name: the presets the CLI lists."""

from __future__ import annotations

from typing import List

from . import _scalify
from ._scalify import Recipe


def preset(name: str) -> Recipe:
    """A named recipe (``preset_names()``): f32, scalify_fp8_3, current, mxfp8, nvfp4, ..."""
    return Recipe.preset(name)


def preset_names() -> List[str]:
    """The names of every preset recipe, in the order the CLI lists them."""
    return _scalify.preset_names()


