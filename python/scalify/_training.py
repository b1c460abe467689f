"""Training from Python: the trainer, comparisons, the trainer's GPT and batches, checkpoints, inspect."""

from __future__ import annotations

import json
import operator
import os
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from . import _scalify
from ._scalify import Recipe, Tensor

if TYPE_CHECKING:  # for the annotations only: pandas is optional
    import numpy
    import pandas
    from numpy.typing import NDArray


def train(out: Union[str, "os.PathLike[str]"], *, recipe: Union[str, "os.PathLike[str]", Recipe, None] = None, steps: Optional[int] = None, data: Optional[str] = None, resume: bool = False,
          progress: Optional[Callable[[int, int, float], None]] = None, save_initial: bool = False,
          **settings: object) -> Dict[str, Any]:
    """Trains the GPT as ``scalify train`` does and returns the run's summary with its metrics.

    recipe: a preset name (default f32), a recipe JSON file, or a ``Recipe`` (written into the run
    folder as ``out``/recipe.json). settings: any train config key (d_model=64, layers=2, seq=64,
    batch=16, lr=2e-3, seed=1, ...), as for ``--set``; ``init=DIR`` fine-tunes a pretrained Hugging
    Face folder (its shape; seq may be set up to its context; lr defaults to 5e-5 and min_lr to
    5e-6 there, Hugging Face Trainer's AdamW default). progress(step, steps, loss) is called after
    every step. Ctrl-C stops the run between steps (KeyboardInterrupt); ``resume=True`` continues
    it from its last checkpoint as ``scalify train --resume`` does: under the run's own config.toml
    and recipe, the keys given (steps=... to train further) overriding it; a recipe given must be
    the run's. ``save_initial=True`` also writes the model at step 0 as ``out``/initial.safetensors.
    The run folder's model.safetensors holds the final model alone (checkpoint.safetensors also the
    optimizer state a resume continues from).
    The result holds val_loss, train_loss, tokens_per_s, ..., run_dir and ``metrics``
    (``read_metrics(run_dir)``)."""
    given = dict(settings)
    if steps is not None:
        given["steps"] = steps
    if data is not None:
        given["data"] = data
    if recipe is not None and not isinstance(recipe, Recipe):
        given["recipe"] = recipe
    text = {k: _setting_text(v) for k, v in given.items()}
    result = dict(_scalify.train(os.fspath(out), text, recipe if isinstance(recipe, Recipe) else None, resume, progress, save_initial))
    result["metrics"] = read_metrics(result["run_dir"])
    return result


def compare(out: str, *, recipes: str = "seeds", steps: Optional[int] = None, data: Optional[str] = None,
            seeds: Union[int, Sequence[int], None] = None, speed_rounds: int = 5, resume: bool = False,
            progress: Optional[Callable[..., None]] = None,
            **settings: object) -> Union["pandas.DataFrame", List[Dict[str, Any]]]:
    """Runs ``scalify compare``: the same model and data under each recipe, into ``out``
    (report.md, summary.csv, plots, a run folder per recipe and seed). recipes: a named list
    (seeds, fp8, fp16, fp4, scalify, unit, per_tensor) or comma-separated presets / recipe JSON
    files. seeds: a count (seeds from the config's ``seed`` on) or a list of seeds: every recipe
    trains under each, and each delta's interval holds the seeds' spread. speed_rounds: rounds of
    interleaved speed timing after training (0: the training runs' own speeds). progress is called
    after every training step as ``progress(step, steps, loss, recipe=..., seed=..., run=...,
    runs=..., tokens_per_s=..., eta_s=..., line=...)``: train's three values first (the recipe
    run's step of its steps and its loss), then which run it is (its recipe name and seed, run of
    runs, 1-based), its speed, the whole comparison's remaining seconds and the CLI's progress
    line; ``def progress(step, steps, loss, **run)`` serves train and compare alike. Ctrl-C (KeyboardInterrupt) or an exception raised by progress stops
    the whole comparison and is raised, the recipe then training left resumable; resume=True
    continues the comparison in ``out`` as it was started (the other arguments are not used).
    Returns one row per recipe (val_loss, val_delta against its baseline with val_delta_ci95 and
    verdict, status, tokens_per_s, speed_vs_f32, ...): a pandas DataFrame when pandas is
    installed, else a list of dicts."""
    merged: Dict[str, Any] = {}
    if steps is not None:
        merged["steps"] = steps
    if data is not None:
        merged["data"] = data
    merged.update(settings)
    seed_spec = ""
    if seeds is not None:
        if isinstance(seeds, (str, bytes, bool)):
            raise TypeError(f"compare: seeds must be a count or a list of seeds, not {type(seeds).__name__}")
        if hasattr(seeds, "__index__"):  # a count: int, numpy integer
            seed_spec = str(operator.index(seeds))
        else:
            values = [operator.index(s) for s in seeds]  # TypeError for anything but integers
            if not values:
                raise ValueError("compare: seeds is an empty list")
            if len(values) == 1:  # one seed in a list is that seed, not a count
                if "seed" in merged and int(merged["seed"]) != values[0]:
                    raise ValueError(f"compare: seeds=[{values[0]}] and seed={merged['seed']} disagree")
                merged["seed"] = values[0]
            else:
                seed_spec = ",".join(str(v) for v in values)
    rows = _scalify.compare({k: _setting_text(v) for k, v in merged.items()}, recipes, out, resume, seed_spec, speed_rounds,
                            progress)
    try:
        import pandas
    except ImportError:
        return [dict(r) for r in rows]
    return pandas.DataFrame([dict(r) for r in rows])


def load_checkpoint(path: str) -> Tuple[Dict[str, "NDArray[numpy.float32]"], Dict[str, str]]:
    """A checkpoint or quantised checkpoint (.safetensors) as ({name: float32 array}, metadata).
    Parameters are "param.<name>" (scaled ones with "param.<name>.scale"), optimizer moments
    "optim.m.<name>" / "optim.v.<name>" (encoded moments: "<...>.codes" with their "scales"; the
    metadata's "scalify.state_formats" says their formats); FP8 / FP4 codes come as their format
    values, without their scales, and a non-negative moment's unsigned E4M4 / E5M3 codes (U8) as
    their byte values 0..255."""
    tensors, meta = _scalify.load_checkpoint(path)
    return dict(tensors), dict(meta)


class Gpt:
    """The trainer's GPT, built for a recipe (a preset name, a recipe JSON file or a ``Recipe``):
    ``Gpt(recipe="nvfp4", d_model=64, layers=2, seq=64,
    seed=1)`` (any train config key). ``parameters()`` gives its Tensors by name, ``loss(ids,
    targets)`` a Tensor to ``backward()`` — the same model and initialisation as ``scalify train``
    with the same keys (a recipe's quantised linear layers included)."""

    def __init__(self, recipe: Union[str, "os.PathLike[str]", Recipe] = "f32", **settings: object) -> None:
        r = recipe if isinstance(recipe, Recipe) else _scalify.load_recipe(os.fspath(recipe))
        self._model = _scalify.Gpt({k: _setting_text(v) for k, v in settings.items()}, r)

    def parameters(self) -> Dict[str, Tensor]:
        return dict(self._model.parameters())

    def loss(self, ids: "NDArray[numpy.int64]", targets: "NDArray[numpy.int64]") -> Tensor:
        return self._model.loss(ids, targets)


def training_batch(index: int = 0, **settings: object) -> Tuple["NDArray[numpy.int64]", "NDArray[numpy.int64]"]:
    """The trainer's batch ``index`` (ids, targets: int64 arrays [batch, seq]) for the config keys
    given (data, seed, batch, seq, val_fraction): the batches ``scalify train`` draws."""
    return _scalify.training_batch({k: _setting_text(v) for k, v in settings.items()}, index)


def inspect(checkpoint: str, format: str = "e4m3", initial: bool = False, batch: int = 0, data: str = "") -> Dict[str, Any]:
    """``scalify inspect`` as data: one training batch forward and backward through a checkpoint (a
    run folder or .safetensors; ``initial`` for the run's model at step 0). Returns the recipe,
    step and a list of tensors (activations, their gradients, weights, weight gradients, and the
    optimizer moments where the recipe encodes them), each with its storage, log2 scale, RMS,
    counts against a range (underflow, subnormal, normal, clipped), the range's name (``range``:
    ``format``, or a moment's own code layout: e4m3, e5m2, e4m4 (unsigned), e5m3 (unsigned),
    f16 scaled, bf16) and its exponent histogram (``exponents``, ``counts`` arrays)."""
    return _scalify.inspect(checkpoint, format, initial, batch, data)


def read_metrics(run_dir: str) -> List[Dict[str, Any]]:
    """A run folder's metrics.jsonl as a list of dicts (steps, evaluations, quantiser statistics)."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def _setting_text(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return repr(v) if isinstance(v, float) else str(v)
