"""convert(model, recipe): every linear layer of a torch model as a scalify.torch.Linear; statistics."""

from __future__ import annotations

import importlib
import re
from typing import Any, Callable, List, Optional, cast

import torch

from .. import _scalify
from ._linear import Linear
from ._recipe import RecipeLike, as_recipe

_BLOCK_INDEX = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")


def _is_conv1d(module: torch.nn.Module) -> bool:
    """transformers' GPT-2 Conv1D: a linear layer whose weight is [in, out] (nf outputs)."""
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf") and getattr(module, "weight", None) is not None


def _block_of(name: str) -> int:
    """The transformer block a layer belongs to: the first number in its qualified name
    (transformer.h.3.mlp.c_fc, model.layers.3.mlp.up_proj, encoder.layer.3.output.dense), or -1."""
    m = _BLOCK_INDEX.search(name)
    return int(m.group(1)) if m else -1


def convert(model: torch.nn.Module, recipe: RecipeLike, *,
            module_filter_fn: Optional[Callable[[torch.nn.Module, str], bool]] = None) -> torch.nn.Module:
    """Swaps, in place, every ``nn.Linear`` of ``model`` (and transformers' GPT-2 ``Conv1D``) for a
    ``scalify.torch.Linear`` under ``recipe`` (a preset name, a ``Recipe`` or a ``LinearRecipe``)
    that keeps the layer's own weight and bias Parameters (float32 or bfloat16), and returns the
    model. Create the optimizer after converting, or keep using it: the Parameters are the same.

    The recipe's high-precision layers stay as they are: its ``layers`` name patterns ('*' any
    run of characters) against each layer's qualified name, and its first / last blocks, a layer's
    block being the first number in its name (``transformer.h.3.attn.c_attn`` is in block 3 of
    the model's blocks); a layer outside any numbered block (a model's output head) stays
    high precision, as the trainer's head does. ``module_filter_fn(module, name)`` returning False
    leaves a layer out too (torchao's convention)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"convert: needs a torch.nn.Module, not {type(model).__name__}")
    whole = as_recipe(recipe)
    candidates = [(name, m) for name, m in model.named_modules()
                  if name and (type(m) is torch.nn.Linear or _is_conv1d(m))]
    blocks = max([_block_of(name) for name, _ in candidates], default=-1) + 1
    for name, module in candidates:
        if module_filter_fn is not None and not module_filter_fn(module, name):
            continue
        block = _block_of(name)
        if block < 0:
            continue
        linear = _scalify.linear_recipe_for(whole, name, block, blocks)
        if not linear.quantized:
            continue
        _replace(model, name, _swapped(module, linear, name))
    return model


def _swapped(module: torch.nn.Module, linear: Any, name: str) -> Linear:
    conv1d = _is_conv1d(module)
    weight = module.weight
    if weight.device.type != "cpu":
        raise TypeError(f"convert: layer '{name}' is on {weight.device}; scalify.torch runs on the CPU")
    in_features, out_features = (weight.shape[0], weight.shape[1]) if conv1d else (weight.shape[1], weight.shape[0])
    layer = Linear(in_features, out_features, bias=module.bias is not None, recipe=linear, name=name,
                   dtype=weight.dtype, weight_in_out=conv1d)
    layer.weight = cast(torch.nn.Parameter, weight)  # the same Parameters: an optimizer made before still updates them
    layer.bias = cast(Optional[torch.nn.Parameter], module.bias)
    layer.train(module.training)
    return layer


def _replace(model: torch.nn.Module, name: str, new: torch.nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def statistics(model: torch.nn.Module) -> Any:
    """The per-operand counters of every ``scalify.torch.Linear`` in ``model``, as the CLI reports
    them: one row per layer and operand (layer, operand, format, scaling, steps, amax, scale,
    underflow, underflow_energy, clipped), of each quantiser's last quantisation. A pandas
    DataFrame when pandas is installed, else a list of dicts."""
    rows: List[dict[str, Any]] = []
    for name, m in model.named_modules():
        if isinstance(m, Linear):
            rows.extend({"layer": name, **d} for d in m.statistics())
    try:
        pandas = importlib.import_module("pandas")
    except ImportError:
        return rows
    return pandas.DataFrame(rows)
