"""convert(model, recipe): every linear layer of a torch model as a scalify.torch.Linear; statistics."""

from __future__ import annotations

import importlib
import re
import warnings
from typing import Any, Callable, Dict, List, Optional, cast

import torch

from .. import _scalify
from ._linear import Linear
from ._recipe import RecipeLike, as_recipe

_BLOCK_INDEX = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")


def _is_conv1d(module: torch.nn.Module) -> bool:
    """transformers' GPT-2 Conv1D: a linear layer whose weight is [in, out] (nf outputs)."""
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf") and getattr(module, "weight", None) is not None


def first_number(name: str) -> Optional[int]:
    """The default block of a layer: the first number in its qualified name
    (transformer.h.3.mlp.c_fc, model.layers.3.mlp.up_proj, encoder.layer.3.output.dense: 3), or None."""
    m = _BLOCK_INDEX.search(name)
    return int(m.group(1)) if m else None


def convert(model: torch.nn.Module, recipe: RecipeLike, *,
            module_filter_fn: Optional[Callable[[torch.nn.Module, str], bool]] = None,
            name_fn: Optional[Callable[[str], str]] = None,
            block_of: Callable[[str], Optional[int]] = first_number) -> torch.nn.Module:
    """Swaps, in place, every ``nn.Linear`` of ``model`` (and transformers' GPT-2 ``Conv1D``) for a
    ``scalify.torch.Linear`` under ``recipe`` (a preset name, a ``Recipe`` or a ``LinearRecipe``)
    that keeps the layer's own weight and bias Parameters (float32 or bfloat16), and returns the
    model. Create the optimizer after converting, or keep using it: the Parameters are the same.

    Each layer is named ``name_fn(qualified name)`` (default: the qualified name itself): the name
    sets its stochastic-rounding stream, as the trainer's layer names do, and is what the recipe's
    ``layers`` patterns match. ``block_of(qualified name)`` says which of the model's blocks a
    layer belongs to (default: the first number in the name, so ``transformer.h.3.attn.c_attn``
    is in block 3; an ``nn.Sequential``'s entries are blocks of their own) or None for a layer
    outside the blocks (a model's output head), which stays high precision as the trainer's head
    does; the recipe's first / last high-precision blocks count from those. ``module_filter_fn(module,
    qualified name)`` returning False leaves a layer out too (torchao's convention). Subclasses of
    ``nn.Linear`` stay as they are (their forward may not be ``nn.Linear``'s: ``nn.MultiheadAttention``
    reads its ``out_proj`` weight directly); a layer shared by several parents is swapped in every one.
    Converting no layer at all warns, saying why."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"convert: needs a torch.nn.Module, not {type(model).__name__}")
    whole = as_recipe(recipe)
    places: Dict[int, List[str]] = {}  # every qualified name of each linear layer (a shared layer has several)
    modules: Dict[int, torch.nn.Module] = {}
    subclasses: List[str] = []
    for name, m in model.named_modules(remove_duplicate=False):
        if name and (type(m) is torch.nn.Linear or _is_conv1d(m)):
            places.setdefault(id(m), []).append(name)
            modules[id(m)] = m
        elif name and isinstance(m, torch.nn.Linear) and not isinstance(m, Linear):
            subclasses.append(name)
    blocks_of = {key: block_of(names[0]) for key, names in places.items()}
    blocks = max((b for b in blocks_of.values() if b is not None), default=-1) + 1
    left: Dict[str, List[str]] = {"outside any block": [], "by the filter": [], "by the recipe's high-precision layers": []}
    for key, names in places.items():
        module, qualified, block = modules[key], names[0], blocks_of[key]
        name = qualified if name_fn is None else name_fn(qualified)
        if module_filter_fn is not None and not module_filter_fn(module, qualified):
            left["by the filter"].append(qualified)
        elif block is None:
            left["outside any block"].append(qualified)
        else:
            linear = _scalify.linear_recipe_for(whole, name, block, blocks)
            if not linear.quantized:
                left["by the recipe's high-precision layers"].append(qualified)
                continue
            new = _swapped(module, linear, name)
            for place in names:
                _replace(model, place, new)
    converted = sum(1 for m in model.modules() if isinstance(m, Linear))
    if converted == 0:
        reasons = [f"{len(v)} {k} ({_listed(v)})" for k, v in left.items() if v]
        if subclasses:
            reasons.append(f"{len(subclasses)} subclasses of nn.Linear ({_listed(subclasses)})")
        warnings.warn("scalify.torch.convert: no layer converted: " + ("; ".join(reasons) or "the model has no nn.Linear")
                      + (". A layer's block is the first number in its name: pass block_of= for a model without numbered "
                         "blocks" if left["outside any block"] else ""), RuntimeWarning, stacklevel=2)
    return model


def _listed(names: List[str]) -> str:
    return ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")


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
