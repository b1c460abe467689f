"""scalify(model, recipe): a torch model's parameters as ScaledTensors, so its forward, backward and
optimizer propagate scales as the recipe says (SCALIFY, seed 000)."""

from __future__ import annotations

from typing import Any, Dict

import torch
from torch.nn.utils import parametrize
from torch.optim.optimizer import register_optimizer_step_post_hook

from .._scalify import scaled as engine
from ._convert import convert
from ._recipe import RecipeLike, as_recipe
from ._scaled_functions import as_scaled, cast_on_forward, dynamic_rescale_grad
from ._scaled_tensor import STORAGE_DTYPES, ScaledTensor, pair


class _CastAtUse(torch.nn.Module):
    """A parameter stored wider than the recipe's data storage, cast to it where it is used (its
    gradient comes back in that storage), as the engine's forward model does."""

    def __init__(self, storage: torch.dtype) -> None:
        super().__init__()
        self.storage = storage

    def forward(self, p: torch.Tensor) -> torch.Tensor:
        return cast_on_forward(p, self.storage)


def _weight_gradient_cast(fmt: str, rescale: bool) -> Any:
    """The engine's cast_weight_gradients: after backward, each parameter's gradient data rounded
    into `fmt` with its propagated scale (rebalanced to unit RMS first where the recipe says),
    held in the gradient's storage (FP8 values are exact in float16)."""

    def cast(p: torch.Tensor) -> None:
        g = p.grad
        if not isinstance(g, ScaledTensor) or getattr(p, "_scalify_cast_deferred", False):
            return  # inside scalify.torch.accumulation: cast once, when the step's micro-batches are summed
        ready = engine.dynamic_rescale(pair(g)) if rescale else pair(g)
        data, scale = engine.cast_data(ready, fmt)
        p.grad = ScaledTensor(data.to(g.data_tensor.dtype), 1.0 if scale is None else scale)

    return cast


def _rescale_state(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    """After any optimizer's step: every `rescale_every` steps of a scalified parameter, it and its
    moments rebalanced to unit RMS (dynamic_rescale), as the engine's AdamW under scalify_fp8_4."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            every = getattr(p, "_scalify_rescale_every", 0)
            state = optimizer.state.get(p, {})
            step = state.get("step")
            if not every or step is None or int(step) % every != 0:
                continue
            with torch.no_grad():
                for t in [p] + [v for v in state.values() if isinstance(v, ScaledTensor) and v.shape == p.shape]:
                    data, scale = engine.dynamic_rescale(pair(t))
                    t._data.copy_(data)  # the value kept: a power of two moved between data and scale
                    t._scale = scale


_state_hook: Any = None


def _rescale_input_gradient(module: torch.nn.Module, args: Any) -> Any:
    return (dynamic_rescale_grad(args[0]),) + tuple(args[1:])


def _is_norm(module: torch.nn.Module) -> bool:
    return isinstance(module, (torch.nn.LayerNorm, torch.nn.RMSNorm)) or type(module).__name__.endswith(("LayerNorm", "RMSNorm"))


def scalify(model: torch.nn.Module, recipe: RecipeLike = "scalify_fp16_1") -> torch.nn.Module:
    """Makes ``model``'s parameters ScaledTensors as a SCALIFY recipe says, in place, and returns
    it: its linear layers become ``scalify.torch.Linear`` under the recipe (``convert``: the
    engine's layer on scaled tensors, whose operands keep their propagated scales and take the
    recipe's formats, E4M3 forward and E5M2 backward under ``scalify_fp8_3``); each parameter's data
    in the recipe's master-weight storage with scale rms rounded down to
    a power of two (the engine's prepare_parameters); where the recipe's data storage is narrower
    (float16 under ``scalify_fp16_1``), each parameter is cast to it where it is used
    (a parametrization: ``state_dict`` names it ``parametrizations.<name>.original``), so
    activations and gradients stay in it end to end; under the recipes that rescale the norms'
    gradients (``scalify_fp16_2``, ``scalify_fp8_3``, ``scalify_fp8_4``) every LayerNorm / RMSNorm
    input's gradient is dynamically rescaled; under ``scalify_fp8_3`` / ``_4`` each weight gradient
    is rounded into E5M2 after backward (inside ``scalify.torch.accumulation``, once at its end).
    An optimizer made afterwards keeps its state as ScaledTensors in the recipe's optimizer-state
    storage; under ``scalify_fp8_4`` every 100 steps each parameter and its moments are rebalanced
    to unit RMS after the optimizer's step (any ``torch.optim`` optimizer whose state counts
    ``step``). Inputs that are plain tensors count as scale 1."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"scalify: needs a torch.nn.Module, not {type(model).__name__}")
    r = as_recipe(recipe)
    if not r.scaled_state:
        raise ValueError(f"scalify: recipe {r.name!r} keeps no scaled state; SCALIFY's recipes are "
                         "scalify_fp16_1, scalify_fp16_2, scalify_fp8_3 and scalify_fp8_4")
    master, data, state = (STORAGE_DTYPES[str(d)] for d in (r.master_weight, r.data_storage, r.optimizer_state))
    convert(model, r)  # the linear layers: the engine's own on scaled tensors (FP8 #3's e4m3 / e5m2 casts)
    made: Dict[int, torch.nn.Parameter] = {}  # a parameter shared by modules (a tied head) stays one
    for module in list(model.modules()):
        for name, p in list(module.named_parameters(recurse=False)):
            if isinstance(p, ScaledTensor):
                continue
            if id(p) not in made:
                with torch.no_grad():
                    param = torch.nn.Parameter(as_scaled(p.detach(), master), requires_grad=p.requires_grad)
                param._state_storage = state  # type: ignore[attr-defined]  # zeros_like of it: the optimizer's moments
                if str(r.weight_gradient) != "f32" and param.requires_grad:
                    param._scalify_grad_cast = _weight_gradient_cast(str(r.weight_gradient), r.rescale_gradients)  # type: ignore[attr-defined]
                    param.register_post_accumulate_grad_hook(param._scalify_grad_cast)  # type: ignore[attr-defined,no-untyped-call]
                if r.rescale_every > 0:
                    param._scalify_rescale_every = r.rescale_every  # type: ignore[attr-defined]
                made[id(p)] = param
            setattr(module, name, made[id(p)])
            if data.itemsize < master.itemsize:
                parametrize.register_parametrization(module, name, _CastAtUse(data), unsafe=True)
        if r.rescale_norm_grad and _is_norm(module):
            module.register_forward_pre_hook(_rescale_input_gradient)
    global _state_hook
    if r.rescale_every > 0 and _state_hook is None:  # one hook for every optimizer: it looks for scalified parameters
        _state_hook = register_optimizer_step_post_hook(_rescale_state)
    return model
