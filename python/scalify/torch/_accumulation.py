"""Gradient accumulation as ``scalify train --set accum=N`` runs it."""

from __future__ import annotations

import contextlib
from types import TracebackType
from typing import Iterator, List, Optional, Type

import torch

from ._linear import BETWEEN_MICRO_BATCHES, Linear


class Accumulation:
    """One optimizer step's micro-batches, for every ``scalify.torch.Linear`` in a model.

    Without it each forward and backward is a step of its own for the quantisers. Inside it the
    quantisers do what the trainer's accumulation does: every micro-batch quantises from the state
    the step started with (delayed scaling's scale, the step count), draws its own
    stochastic-rounding bits (micro-batch i, call j of the step), and delayed scaling records the
    step's amax (the largest over its micro-batches) once, when the ``with`` block ends::

        with scalify.torch.accumulation(model) as step:
            for x, y in micro_batches:
                with step.micro_batch():
                    (loss_fn(model(x), y) / len(micro_batches)).backward()
        optimizer.step()

    A forward that records gradients must run inside ``step.micro_batch()`` (its backward may run
    anywhere: it keeps its micro-batch; with ``torch.utils.checkpoint(use_reentrant=True)``, which
    reruns the forward during the backward, run the backward inside too). If the block raises, the quantisers go back to where the
    step started."""

    def __init__(self, model: torch.nn.Module) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"scalify.torch.accumulation: needs a torch.nn.Module, not {type(model).__name__}")
        self._layers: List[Linear] = [m for m in model.modules() if isinstance(m, Linear)]
        # scalify()'s weight-gradient casts: once per step, on the micro-batches' sum, as the trainer's.
        self._casts = [p for p in model.parameters() if hasattr(p, "_scalify_grad_cast")]
        self._next = 0
        self._entered = False

    def __enter__(self) -> "Accumulation":
        if self._entered:
            raise RuntimeError("scalify.torch.accumulation: one object per step (make a new one for the next)")
        for layer in self._layers:
            if layer._micro_batch is not None:
                raise RuntimeError(f"scalify.torch.accumulation: layer {layer.name!r} is already inside another accumulation")
        self._entered = True
        self._start = [layer._core.snapshot() for layer in self._layers]
        self._set(BETWEEN_MICRO_BATCHES)
        for p in self._casts:
            p._scalify_cast_deferred = True  # type: ignore[attr-defined]
        return self

    def __exit__(self, kind: Optional[Type[BaseException]], error: Optional[BaseException],
                 traceback: Optional[TracebackType]) -> None:
        self._set(None)
        for p in self._casts:
            p._scalify_cast_deferred = False  # type: ignore[attr-defined]
            if kind is None:
                p._scalify_grad_cast(p)
        for layer, start in zip(self._layers, self._start):
            if kind is None:
                layer._core.commit_step()
            else:  # the step did not happen
                layer._core.restore(start)
            layer._core.save_state(layer.quantizer_state)

    @contextlib.contextmanager
    def micro_batch(self) -> Iterator[int]:
        """The next micro-batch (0, 1, ...): forwards inside the block belong to it; yields its index."""
        if not self._entered:
            raise RuntimeError("scalify.torch.accumulation: micro_batch() runs inside `with scalify.torch.accumulation(model) as step:`")
        index, self._next = self._next, self._next + 1
        self._set(index)
        try:
            yield index
        finally:
            self._set(BETWEEN_MICRO_BATCHES)

    def _set(self, micro_batch: Optional[int]) -> None:
        for layer in self._layers:
            layer._micro_batch = micro_batch


def accumulation(model: torch.nn.Module) -> Accumulation:
    """Gradient accumulation over one optimizer step of ``model``, as the trainer does it: see
    ``Accumulation``."""
    return Accumulation(model)
