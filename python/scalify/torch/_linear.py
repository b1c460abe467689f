"""scalify.torch.Linear: an nn.Module whose three GEMMs run the engine's quantised linear layer."""

from __future__ import annotations

import math
import weakref
from typing import Any, Callable, List, Optional, Tuple

import numpy as np
import torch

from .. import _scalify
from .._scalify import LinearRecipe
from ._recipe import RecipeLike, as_recipe
from ._scaled_tensor import ScaledTensor, pair, scaled

# Input dtypes the layer takes: converted exactly to float32 (the quantisers' input), the output
# given back in the input's dtype, as nn.Linear does.
_INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# Linear._micro_batch inside scalify.torch.accumulation but outside its micro_batch() blocks.
BETWEEN_MICRO_BATCHES = -2


def _checkpoint_frame() -> Any:
    """The torch.utils.checkpoint frame (use_reentrant=False) of the forward running now, in its
    first pass or in its recomputation during backward, or None. Both passes install saved-tensor
    hooks whose pack function holds the frame: `frame` in the first, `target_frame_ref` (a weak
    reference) in the recomputation (torch/utils/checkpoint.py: _checkpoint_hook,
    _recomputation_hook)."""
    hooks = torch._C._autograd._top_saved_tensors_default_hooks(False)
    if hooks is None:
        return None
    pack = hooks[0]
    while hasattr(pack, "__wrapped__"):  # the recomputation's pack function is wrapped by torch._dynamo.disable
        pack = pack.__wrapped__
    cells = dict(zip(getattr(pack, "__code__").co_freevars, getattr(pack, "__closure__", None) or ()))
    if "frame" in cells:
        return cells["frame"].cell_contents
    if "target_frame_ref" in cells:
        return cells["target_frame_ref"].cell_contents()
    return None


def _bias_gradient(grad_output: torch.Tensor) -> torch.Tensor:
    """The engine's bias gradient: the rows of grad_output [rows, out] summed in f64 and rounded
    once (torch's float32 sum rounds differently in most elements)."""
    summed = _scalify.sum(_scalify.Tensor(grad_output.to(torch.float32).contiguous()), dim=0)
    return torch.from_numpy(np.asarray(summed))


def _engine_forward(layer: "Linear", mode: str, micro_batch: int, replay: Optional[Tuple[Any, int]],
                    run: Callable[[bool, int], Tuple[Any, Any]]) -> Tuple[Any, Any]:
    """The engine's forward, run(training, micro_batch), in the quantisers' state the mode asks for."""
    core = layer._core
    if replay is not None:  # activation checkpointing recomputes a forward: the same codes, the state kept
        now = core.snapshot()
        core.restore(replay[0])
        out = run(True, replay[1])
        core.restore(now)
    elif mode == "frozen":  # model.eval() recording gradients: the quantisers do not advance
        now = core.snapshot()
        out = run(True, micro_batch)
        core.restore(now)
    else:
        out = run(mode == "training", micro_batch)
        if mode == "training":
            core.save_state(layer.quantizer_state)
    return out


def _engine_backward(ctx: Any, run: Callable[[], Tuple[Any, Any]]) -> Tuple[Any, Any]:
    """The engine's backward, run(), after the forward's checks; the quantisers as the mode says."""
    if ctx.call is None:
        raise RuntimeError("scalify.torch.Linear: a backward already ran through this forward, whose engine graph it freed "
                           "(retain_graph cannot keep it); run the forward again")
    ctx.saved_tensors  # raises if x or the weight changed in place since the forward
    core = ctx.layer._core
    now = core.snapshot() if ctx.frozen else None
    grads = run()
    if now is not None:
        core.restore(now)
    else:
        core.save_state(ctx.layer.quantizer_state)
    ctx.call = None  # the engine's graph is freed
    return grads


class _QuantizedMatmul(torch.autograd.Function):
    """y = x w^T + b through the engine: x [rows, in] float32; the weight and bias as the module holds them."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], layer: "Linear",
                mode: str, micro_batch: int, replay: Optional[Tuple[Any, int]]) -> torch.Tensor:
        weight_t = layer._weight_in_out(weight)
        out, call = _engine_forward(layer, mode, micro_batch, replay, lambda training, micro: layer._core.forward(x, weight_t, training, micro))
        ctx.save_for_backward(x, weight_t)  # the engine reads them where they are: torch refuses a backward after an in-place change
        ctx.call, ctx.layer, ctx.weight_dtype, ctx.frozen = call, layer, weight.dtype, mode == "frozen"
        ctx.bias_dtype = None if bias is None else bias.dtype
        y = torch.from_numpy(out)
        if bias is not None:  # in place: the output is a buffer the engine reuses; a new one costs page faults
            y.add_(bias.to(torch.float32))
        return y

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        dx, dw = _engine_backward(ctx, lambda: ctx.call.backward(grad_output.to(torch.float32).contiguous()))
        grad_weight = torch.from_numpy(dw)  # [in, out]
        if not ctx.layer.weight_in_out:
            grad_weight = grad_weight.t()
        grad_bias = None if ctx.bias_dtype is None else _bias_gradient(grad_output).to(ctx.bias_dtype)
        return torch.from_numpy(dx), grad_weight.to(ctx.weight_dtype), grad_bias, None, None, None, None


class _ScaledQuantizedMatmul(torch.autograd.Function):
    """x w^T through the engine on ScaledTensors (SCALIFY): the operands keep their propagated
    scales and the output and both gradients get theirs by the engine's rules, as `scalify
    train`'s layer on scaled tensors. The bias is added outside, by the add rule, as the engine adds it."""

    @staticmethod
    def forward(ctx: Any, x: Any, weight: Any, layer: "Linear", mode: str, micro_batch: int,
                replay: Optional[Tuple[Any, int]]) -> Any:
        w = pair(weight)
        weight_t = (w[0] if layer.weight_in_out else w[0].t().contiguous(), w[1])
        out, call = _engine_forward(layer, mode, micro_batch, replay,
                                    lambda training, micro: layer._core.forward_scaled(pair(x), weight_t, training, micro))
        ctx.save_for_backward(x, weight)
        ctx.call, ctx.layer, ctx.frozen = call, layer, mode == "frozen"
        return scaled(out)

    @staticmethod
    def backward(ctx: Any, grad_output: Any) -> Tuple[Any, ...]:
        dx, dw = _engine_backward(ctx, lambda: ctx.call.backward_scaled(pair(grad_output)))
        grad_weight = scaled(dw)  # [in, out]
        return scaled(dx), grad_weight if ctx.layer.weight_in_out else grad_weight.t(), None, None, None, None


class Linear(torch.nn.Module):
    """``nn.Linear`` under a Scalify recipe: y = x W^T + b, with each operand of the forward GEMM and
    of both backward GEMMs quantised as ``recipe`` says and the GEMMs run by Scalify's C++ engine,
    bit-identical to ``scalify train``'s quantised layers.

    recipe: a preset name (``scalify.preset_names()``), a ``Recipe`` (its ``linear``) or a
    ``LinearRecipe``. name: the layer's name, which sets its stochastic-rounding stream (the
    trainer's rule: the same name gives the same bits; ``convert`` passes the module's qualified
    name). Parameters are float32 or bfloat16 (``dtype``); inputs float32, bfloat16 or float16 on
    the CPU, any layout; the output has the input's dtype. The quantisers' state (delayed
    scaling's amax history and scale, every quantiser's step count, which also moves its
    stochastic-rounding stream) is the int64 buffer ``quantizer_state``, so ``state_dict()`` and
    ``torch.save`` carry it and a resumed run continues bit for bit. In training mode a forward
    that records gradients advances the quantisers (each call a step of its own, or one step per
    ``scalify.torch.accumulation`` block, as the trainer accumulates gradients); one under
    ``torch.no_grad()`` / ``inference_mode()`` uses their state as it stands, as the trainer's
    evaluation does, and so does every forward and backward after ``model.eval()`` (as BatchNorm
    keeps its running statistics). ``torch.autocast`` does not reach
    inside (the recipe sets this layer's precision); ``torch.compile`` runs it as a graph break.
    Activation checkpointing (``torch.utils.checkpoint``, transformers'
    ``gradient_checkpointing_enable()``) gives the gradients and quantiser state of a run without
    it: a forward recomputed during backward repeats its first pass's quantisation and does not
    advance the quantisers (in any number of regions and forwards before one backward). It saves
    this layer's memory only with ``use_reentrant=True`` (whose first forward records nothing);
    with ``use_reentrant=False`` the first forward's engine graph, its quantised operands
    included, is kept until the backward."""

    weight: torch.nn.Parameter
    bias: Optional[torch.nn.Parameter]
    quantizer_state: torch.Tensor

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        recipe: RecipeLike = "current",
        name: str = "",
        dtype: Optional[torch.dtype] = None,
        weight_in_out: bool = False,
    ) -> None:
        super().__init__()
        dtype = torch.float32 if dtype is None else dtype
        if dtype not in (torch.float32, torch.bfloat16):
            raise TypeError(f"scalify.torch.Linear: parameters are float32 or bfloat16, not {dtype}")
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.weight_in_out = weight_in_out  # GPT-2's Conv1D holds its weight [in, out]
        shape = (self.in_features, self.out_features) if weight_in_out else (self.out_features, self.in_features)
        self.weight = torch.nn.Parameter(torch.empty(shape, dtype=dtype))
        self.bias = torch.nn.Parameter(torch.empty(self.out_features, dtype=dtype)) if bias else None
        self.reset_parameters()
        self._recipe = as_recipe(recipe).linear
        self._name = name
        self._core = _scalify.QuantizedLinear(self._recipe, name)
        self.register_buffer("quantizer_state", torch.zeros(6, self._core.state_width(), dtype=torch.int64))
        # Per non-reentrant checkpointed region (torch.utils.checkpoint's frame, use_reentrant=False),
        # the quantisers before each of this layer's forwards in it and its micro-batch, until the
        # checkpoint recomputes the region during backward: each recomputed forward quantises as its
        # first pass did (delayed scaling's scale, the stochastic-rounding streams) and leaves the
        # quantisers where it found them. A region never recomputed (no backward) drops its entry
        # with its frame.
        self._before_forward: "weakref.WeakKeyDictionary[Any, List[Tuple[Any, int]]]" = weakref.WeakKeyDictionary()
        # Set by scalify.torch.accumulation: None outside one, else the open micro-batch (BETWEEN_MICRO_BATCHES: none).
        self._micro_batch: Optional[int] = None
        self._core.save_state(self.quantizer_state)
        self.register_load_state_dict_post_hook(Linear._state_loaded)  # type: ignore[no-untyped-call]

    @property
    def recipe(self) -> LinearRecipe:
        """The LinearRecipe the three GEMMs follow (fixed at construction)."""
        return self._recipe

    @property
    def name(self) -> str:
        """The layer's name: its stochastic-rounding stream (fixed at construction)."""
        return self._name

    def reset_parameters(self) -> None:
        """nn.Linear's initialisation: uniform(-1/sqrt(in), 1/sqrt(in)) for the weight and bias."""
        bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
        with torch.no_grad():
            w = torch.empty(self.out_features, self.in_features)
            torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5))
            self.weight.copy_(w.t() if self.weight_in_out else w)
            if self.bias is not None:
                self.bias.uniform_(-bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _run_eagerly(self, x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"scalify.torch.Linear: needs a torch.Tensor, not {type(x).__name__}")
        if x.device.type != "cpu":
            raise TypeError(f"scalify.torch.Linear runs on the CPU; got a tensor on {x.device} (move it with .cpu())")
        if x.dtype not in _INPUT_DTYPES:
            raise TypeError(f"scalify.torch.Linear: inputs are float32, bfloat16 or float16, not {x.dtype}"
                            + (" (the quantised GEMMs compute in float32: convert with .float())" if x.dtype == torch.float64 else ""))
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            raise ValueError(f"scalify.torch.Linear: input of shape {tuple(x.shape)} does not end in in_features={self.in_features}")
        if self.weight.device.type != "cpu":
            raise TypeError(f"scalify.torch.Linear runs on the CPU; its weight is on {self.weight.device}")
        records = torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad
                                               or (self.bias is not None and self.bias.requires_grad))
        mode = "inference" if not records else "training" if self.training else "frozen"
        micro_batch = self._micro_batch_index() if mode == "training" else -1
        replay = None
        frame = _checkpoint_frame() if records else None
        if frame is not None and torch._C._current_graph_task_id() == -1:  # a checkpointed region's first pass
            self._before_forward.setdefault(frame, []).append((self._core.snapshot(), micro_batch))
        elif frame is not None:  # its recomputation during backward: this layer's forwards in the same order
            pending = self._before_forward.get(frame)
            replay = pending.pop(0) if pending else None
        y: torch.Tensor
        if isinstance(x, ScaledTensor) or isinstance(self.weight, ScaledTensor):  # SCALIFY's scaled tensors
            y = _ScaledQuantizedMatmul.apply(x.reshape(-1, self.in_features), self.weight, self, mode, micro_batch, replay)
            y = y if self.bias is None else y + self.bias
            return y.reshape(*x.shape[:-1], self.out_features)
        x2d = x.reshape(-1, self.in_features).to(torch.float32).contiguous()
        y = _QuantizedMatmul.apply(x2d, self.weight, self.bias, self, mode, micro_batch, replay)
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def _micro_batch_index(self) -> int:
        if self._micro_batch == BETWEEN_MICRO_BATCHES:
            raise RuntimeError(f"scalify.torch.Linear {self._name!r}: inside scalify.torch.accumulation, run each micro-batch's "
                               "forward inside `with step.micro_batch():`")
        return -1 if self._micro_batch is None else self._micro_batch

    def _weight_in_out(self, weight: torch.Tensor) -> torch.Tensor:
        w = weight.detach().to(torch.float32)
        return (w if self.weight_in_out else w.t()).contiguous()

    def statistics(self) -> list[dict[str, Any]]:
        """Each operand's quantiser (weight, activation, gradient, weight_t, activation_t,
        gradient_t): format, scaling, steps and its last quantisation's amax, scale, underflow
        (fraction of non-zeros flushed to zero), underflow_energy (their share of the squared norm)
        and clipped (fraction beyond the format's range)."""
        return [dict(d) for d in self._core.statistics()]

    def extra_repr(self) -> str:
        f = self._recipe.forward
        recipe = f"{f.activation.format}/{self._recipe.input_grad.gradient.format} {f.activation.scaling}" if self._recipe.quantized else "f32"
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, recipe={recipe}"

    @staticmethod
    def _state_loaded(module: torch.nn.Module, incompatible_keys: Any) -> None:
        # A state_dict of the model before conversion has weights only: loading it keeps the
        # quantisers' state as it is instead of failing on the missing buffer.
        missing = incompatible_keys.missing_keys
        missing[:] = [k for k in missing if k != "quantizer_state" and not k.endswith(".quantizer_state")]
        assert isinstance(module, Linear)
        module._core.load_state(module.quantizer_state.contiguous())

    # torch.save(model) and copy.deepcopy: the engine's layer is rebuilt from the recipe and the state buffer.
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_core"]
        state["_before_forward"], state["_micro_batch"] = None, None  # forwards' and an accumulation's, not the layer's
        state["_recipe"] = as_recipe(self._recipe).to_json()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state["_recipe"] = _scalify.Recipe.from_json(state["_recipe"]).linear
        self.__dict__.update(state)
        self._before_forward = weakref.WeakKeyDictionary()
        self._core = _scalify.QuantizedLinear(self._recipe, self._name)
        self._core.load_state(self.quantizer_state.contiguous())


def _forward_of(layer: Linear, x: torch.Tensor) -> torch.Tensor:
    return layer._forward(x)


# The engine is opaque to torch.compile: the layer is a graph break, never a wrong trace.
_run_eagerly: Callable[[Linear, torch.Tensor], torch.Tensor] = torch.compiler.disable(_forward_of)  # type: ignore[no-untyped-call]
