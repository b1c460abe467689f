"""The engine's own differentiable ops on torch tensors: each forward runs the C++ engine's kernel
(the one ``scalify train`` runs) and each backward the engine's backward, so a torch model built
from these ops and ``scalify.torch.Linear`` computes, bit for bit, what the engine computes.

    import scalify.torch.functional as SF
    h = SF.layer_norm(x, weight, bias, eps=1e-5)        # instead of F.layer_norm
    y = SF.causal_self_attention(qkv, heads=12)         # [B, T, 3D] -> [B, T, D]
    loss = SF.cross_entropy(logits, targets)            # mean over rows

torch's own ops compute the same functions with other kernels (other reduction orders, other exp
and tanh): 1 to 3 ulp apart, which a quantised layer downstream can turn into a different code.
Use these where a torch model must reproduce the engine exactly; use torch's elsewhere.

Inputs are CPU float32 or float64 tensors of any layout (a 2-D transposed view such as
``weight.t()`` reaches the engine as the engine's own transpose of the stored matrix); integer
indices (ids, targets) are integer tensors or arrays. ``causal_self_attention`` also takes a
``ScaledTensor`` (a model under ``scalify.torch.scalify``), on which it runs the engine's scaled
fused attention. Values cross into and out of the engine by
a copy (one pass over each, small beside the ops; scalify.torch.Linear shares memory). Each op's
backward runs once (the engine frees its graph): ``retain_graph=True`` cannot keep it, and a
second backward through one forward raises. ``engine_op`` wraps any function of
``scalify.Tensor`` values (``scalify.layer_norm``, ``scalify.unit.gelu``, ...) the same way.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple, Union

import numpy as np
import numpy.typing as npt
import torch

from .. import _scalify
from .._scalify import Tensor as EngineTensor
from .._scalify import scaled as scaled_engine
from ._scaled_tensor import ScaledTensor, pair, scaled

__all__ = ["engine_op", "add", "matmul", "layer_norm", "gelu", "softmax", "embedding", "causal_self_attention",
           "cross_entropy"]

_FLOAT_DTYPES = (torch.float32, torch.float64)
Indices = Union[torch.Tensor, npt.NDArray[np.integer[Any]]]


def _check_input(t: object, who: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"scalify.torch.functional.{who}: needs torch.Tensor inputs, not {type(t).__name__}")
    if t.device.type != "cpu":
        raise TypeError(f"scalify.torch.functional.{who} runs on the CPU; got a tensor on {t.device} (move it with .cpu())")
    if t.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"scalify.torch.functional.{who}: inputs are float32 or float64, not {t.dtype}")
    return t


def _is_transposed_matrix(t: torch.Tensor) -> bool:
    """A 2-D view whose transpose is contiguous (``w.t()``), not itself contiguous."""
    return t.dim() == 2 and not t.is_contiguous() and t.t().is_contiguous()


def _to_engine(t: torch.Tensor, requires_grad: bool) -> Tuple[EngineTensor, EngineTensor]:
    """(the leaf whose gradient the backward reads, the value the op takes)."""
    if _is_transposed_matrix(t):  # the stored matrix and the engine's transpose, as the engine's tied head
        leaf = EngineTensor(t.detach().t(), requires_grad=requires_grad)
        return leaf, _scalify.transpose(leaf, 0, 1)
    leaf = EngineTensor(t.detach().contiguous(), requires_grad=requires_grad)
    return leaf, leaf


def _to_torch(values: Any) -> torch.Tensor:
    return torch.from_numpy(np.asarray(values))


class _EngineOp(torch.autograd.Function):
    """One engine op (a function of scalify.Tensors) as a torch op: the engine's graph between them."""

    @staticmethod
    def forward(ctx: Any, op: Callable[..., EngineTensor], who: str, *inputs: torch.Tensor) -> torch.Tensor:
        leaves: List[EngineTensor] = []
        values: List[EngineTensor] = []
        for t, needs in zip(inputs, ctx.needs_input_grad[2:]):
            leaf, value = _to_engine(t, bool(needs))
            leaves.append(leaf)
            values.append(value)
        out = op(*values)
        if not isinstance(out, EngineTensor):
            raise TypeError(f"scalify.torch.functional.{who}: the op must return a scalify.Tensor, not {type(out).__name__}")
        ctx.save_for_backward(*inputs)  # torch refuses the backward if an input changed in place since
        ctx.leaves, ctx.out, ctx.who = leaves, out, who
        ctx.transposed = [_is_transposed_matrix(t) for t in inputs]
        ctx.dtypes = [t.dtype for t in inputs]
        return _to_torch(out)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        if ctx.out is None:
            raise RuntimeError(f"scalify.torch.functional.{ctx.who}: a backward already ran through this forward, whose "
                               "engine graph it freed (retain_graph cannot keep it); run the forward again")
        ctx.saved_tensors  # raises if an input changed in place
        out, ctx.out = ctx.out, None
        if out.requires_grad:
            out.backward(grad_output.detach().to(_to_torch(out).dtype).contiguous().numpy())
        grads: List[Optional[torch.Tensor]] = [None, None]
        for leaf, transposed, dtype in zip(ctx.leaves, ctx.transposed, ctx.dtypes):
            g = leaf.grad
            if g is None:
                grads.append(None)
                continue
            grad = torch.from_numpy(g).to(dtype)
            grads.append(grad.t() if transposed else grad)
        ctx.leaves = None
        return tuple(grads)


def engine_op(op: Callable[..., EngineTensor], *inputs: torch.Tensor, name: str = "engine_op") -> torch.Tensor:
    """``op(*inputs)`` run by the engine as one torch op: ``op`` takes one ``scalify.Tensor`` per
    input (the torch tensors' values; a 2-D transposed view arrives as the engine's transpose of the
    stored matrix) and returns a ``scalify.Tensor`` computed from them with the engine's
    differentiable ops (``scalify.layer_norm``, ``scalify.matmul``, ``scalify.unit.gelu``, ...);
    non-tensor arguments go in through a closure. Forward: the engine's value as a new torch
    tensor (float32, or float64 for float64 inputs). Backward: the engine's backward of ``op``'s
    graph, giving each input that requires a gradient the engine's gradient. ``name`` labels
    error messages."""
    for t in inputs:
        _check_input(t, name)
    if not callable(op):
        raise TypeError(f"scalify.torch.functional.{name}: op must be callable, not {type(op).__name__}")
    out: torch.Tensor = _EngineOp.apply(op, name, *inputs)
    return out


def _indices(ids: Indices, who: str) -> npt.NDArray[np.int64]:
    if isinstance(ids, torch.Tensor):
        if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
            raise TypeError(f"scalify.torch.functional.{who}: indices are an integer tensor, not {ids.dtype}")
        return np.ascontiguousarray(ids.detach().cpu().numpy(), dtype=np.int64)
    if isinstance(ids, np.ndarray) and np.issubdtype(ids.dtype, np.integer):
        return np.ascontiguousarray(ids, dtype=np.int64)
    raise TypeError(f"scalify.torch.functional.{who}: indices are an integer torch.Tensor or NumPy array, not {type(ids).__name__}")


def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a + b, broadcast; a broadcast operand's gradient is the engine's sum of the output's gradient
    (f64 accumulation, rounded once: a linear layer's bias gradient as the engine computes it)."""
    return engine_op(_scalify.add, a, b, name="add")


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b over the last two dimensions (a [..., M, K], b [..., K, N], batch dimensions broadcast)
    with the engine's GEMM; a 2-D b shared by every batch row (a linear layer's weight, a tied
    head ``wte.t()``) gets its gradient from one GEMM over all rows, as in the engine."""
    return engine_op(_scalify.matmul, a, b, name="matmul")


def layer_norm(x: torch.Tensor, weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None, *,
               eps: float = 1e-5) -> torch.Tensor:
    """Layer normalisation over the last dimension, then ``* weight + bias`` when given (each of
    the last dimension's size): the engine's fused kernel and its backward."""
    if bias is not None and weight is None:
        raise ValueError("scalify.torch.functional.layer_norm: a bias needs a weight (the engine's affine form is x w + b)")
    if weight is None:
        return engine_op(lambda v: _scalify.layer_norm(v, eps=eps), x, name="layer_norm")
    if bias is None:
        return engine_op(lambda v, w: _scalify.layer_norm(v, w, eps=eps), x, weight, name="layer_norm")
    return engine_op(lambda v, w, b: _scalify.layer_norm(v, w, b, eps=eps), x, weight, bias, name="layer_norm")


def gelu(x: torch.Tensor, *, approximate: str = "tanh") -> torch.Tensor:
    """GELU, elementwise: ``approximate="tanh"`` (GPT-2's, the default, as the engine's GPT uses)
    or ``"none"`` (the exact, erf form). Note torch's default is ``"none"``."""
    if approximate == "tanh":
        return engine_op(_scalify.gelu, x, name="gelu")
    if approximate == "none":
        return engine_op(_scalify.gelu_erf, x, name="gelu")
    raise ValueError(f"scalify.torch.functional.gelu: approximate must be 'tanh' or 'none', got {approximate!r}")


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax over dimension dim."""
    return engine_op(lambda v: _scalify.softmax(v, dim), x, name="softmax")


def embedding(ids: Indices, weight: torch.Tensor) -> torch.Tensor:
    """The rows of weight [V, D] that ids name (any shape, each in [0, V)): [*ids.shape, D]. The
    weight's gradient adds each id's output-gradient rows in the engine's order. Arguments in
    torch's order (``F.embedding(input, weight)``)."""
    idx = _indices(ids, "embedding")
    return engine_op(lambda w: _scalify.embedding(w, idx), weight, name="embedding")


def causal_self_attention(qkv: torch.Tensor, heads: int) -> torch.Tensor:
    """Causal multi-head attention on the packed projection qkv [B, T, 3D] = [q | k | v] (each D
    wide, head h the h-th D/heads slice of each) -> [B, T, D]: per head
    softmax(mask(q k^T / sqrt(D / heads))) v, the engine GPT's fused kernel forward and backward.
    On a ``ScaledTensor`` qkv (one scale; a model under ``scalify.torch.scalify``) it is the
    engine's scaled fused attention, as ``scalify train`` runs it under the SCALIFY recipes: the
    output a ScaledTensor in qkv's storage with the scale the engine's rule gives."""
    if isinstance(heads, bool) or not isinstance(heads, int):
        raise TypeError(f"scalify.torch.functional.causal_self_attention: heads is an int, not {type(heads).__name__}")
    if isinstance(qkv, ScaledTensor):
        if qkv.dim() != 3 or heads < 1 or qkv.shape[-1] % (3 * heads) != 0:
            raise ValueError(f"scalify.torch.functional.causal_self_attention: qkv must be [B, T, 3D] with D a multiple of "
                             f"heads={heads}, got shape {tuple(qkv.shape)}")
        out: torch.Tensor = _ScaledCausalAttention.apply(qkv, heads)
        return out
    return engine_op(lambda v: _scalify.causal_self_attention(v, heads), qkv, name="causal_self_attention")


class _ScaledCausalAttention(torch.autograd.Function):
    """The engine's fused causal attention on a scaled qkv (one scale): the output's scale from
    qkv's by the engine's rule, its data in qkv's storage; the backward the engine's, from the
    probabilities the forward kept."""

    @staticmethod
    def forward(ctx: Any, qkv: ScaledTensor, heads: int) -> Any:
        y, probs = scaled_engine.causal_attention(pair(qkv), heads)
        ctx.save_for_backward(qkv)
        ctx.probs, ctx.heads = probs, heads
        return scaled(y)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        (qkv,) = ctx.saved_tensors
        return scaled(scaled_engine.causal_attention_backward(pair(qkv), ctx.probs, pair(grad), ctx.heads)), None


def cross_entropy(logits: torch.Tensor, targets: Indices) -> torch.Tensor:
    """The mean cross-entropy of logits [N, V] against int64 targets [N] (each in [0, V)): a
    0-d tensor, float32 for float32 logits."""
    idx = _indices(targets, "cross_entropy")
    return engine_op(lambda v: _scalify.cross_entropy(v, idx), logits, name="cross_entropy")
