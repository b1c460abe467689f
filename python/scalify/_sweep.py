"""Hyperparameter-transfer sweeps from Python: ``scalify sweep`` as ``scalify.sweep``."""

from __future__ import annotations

import operator
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from . import _scalify
from ._training import _setting_text


@dataclass(frozen=True)
class SweepCell:
    """One cell of a sweep: a recipe, a shape (width = d_model, depth = layers) and a value of the
    varied key. val_loss: the final validation loss (mean over seeds; NaN unless status is "ok").
    status: "ok", "diverged" (not finite, or above the run's untrained loss) or "failed".
    best: whether this value is its shape's best (lowest loss; ties go to the lower value)."""

    recipe: str
    width: int
    depth: int
    value: float
    label: str
    val_loss: float
    status: str
    note: str
    best: bool


@dataclass(frozen=True)
class SweepVerdict:
    """A recipe's verdict along each axis: "transfers" (the best values within one grid step of
    each other), "moves by N steps", or "no verdict (...)"; *_steps: that largest distance in
    grid steps, None without a verdict."""

    across_widths: str
    across_depths: str
    widths_steps: Optional[int]
    depths_steps: Optional[int]


@dataclass(frozen=True)
class SweepResult:
    """A sweep's outcome: the varied key, its values (ascending, one grid step apart each) and
    their labels, every cell (recipes x depths x widths x values), each recipe's verdict (keyed by
    the recipe as given) and the path of report.md."""

    key: str
    values: List[float]
    labels: List[str]
    cells: List[SweepCell]
    verdicts: Dict[str, SweepVerdict]
    report: str

    def losses(self, recipe: str) -> Dict[tuple[int, int], List[float]]:
        """One recipe's table: {(width, depth): final validation loss per value} (NaN: diverged or failed)."""
        table: Dict[tuple[int, int], List[float]] = {}
        for c in self.cells:
            if c.recipe == recipe:
                table.setdefault((c.width, c.depth), [float("nan")] * len(self.values))[self.values.index(c.value)] = c.val_loss
        return table


def _sizes(name: str, sizes: Optional[Sequence[int]]) -> str:
    if sizes is None:
        return ""
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence):
        raise TypeError(f"sweep: {name} must be a list of integers, not {type(sizes).__name__}")
    values = [operator.index(s) for s in sizes]  # TypeError for anything but integers
    if not values:
        raise ValueError(f"sweep: {name} is an empty list")
    return ",".join(str(v) for v in values)


def sweep(out: Union[str, "os.PathLike[str]"], *, vary: str, widths: Optional[Sequence[int]] = None,
          depths: Optional[Sequence[int]] = None, recipes: Union[str, Sequence[str]] = "f32", steps: Optional[int] = None,
          data: Optional[str] = None, seeds: Union[int, Sequence[int], None] = None,
          progress: Optional[Callable[..., None]] = None, **settings: object) -> SweepResult:
    """Runs ``scalify sweep`` into ``out``: one train-config key over a grid of values, on each
    width and depth, under each recipe; reports whether each recipe's best value transfers.

    vary: ``"KEY=v1,v2,..."`` (numbers, or powers of two such as ``2^-8``; at least 2) or
    ``"KEY=2^a:2^b"`` (every power of two from 2^a to 2^b), e.g. ``"lr=2^-10:2^-4"``. Varying lr
    moves min_lr with it (the config's min_lr / lr ratio). widths: d_model values (heads follow
    as width / the config's head dimension d_model / heads; a width that is not a multiple of it
    is a ValueError); depths: layer counts; both default to the config's. recipes: presets or
    recipe JSON files, a comma-separated string or a list. seeds: a count or a list of seeds (each
    cell's loss their mean). settings: any other train config key (seq=64, batch=16, ...).
    progress(k, n, val_loss, recipe=..., width=..., depth=..., value=..., status=..., line=...) is
    called after each cell. Calling it again with the same arguments and ``out`` skips finished
    cells (an interrupted one resumes); another sweep in that folder is refused. Ctrl-C stops the
    sweep (KeyboardInterrupt). Writes report.md, <recipe>.csv and <recipe>_widths.png (and
    _depths.png with several depths)."""
    if not isinstance(vary, str):
        raise TypeError(f"sweep: vary must be a string such as 'lr=2^-10:2^-4', not {type(vary).__name__}")
    merged: Dict[str, Any] = {}
    if steps is not None:
        merged["steps"] = steps
    if data is not None:
        merged["data"] = data
    merged.update(settings)
    if isinstance(recipes, str):
        recipe_spec = recipes
    else:
        recipe_list = [os.fspath(r) for r in recipes]
        if not recipe_list:
            raise ValueError("sweep: recipes is an empty list")
        recipe_spec = ",".join(recipe_list)
    seed_spec = ""
    if seeds is not None:
        if isinstance(seeds, (str, bytes, bool)):
            raise TypeError(f"sweep: seeds must be a count or a list of seeds, not {type(seeds).__name__}")
        if hasattr(seeds, "__index__"):
            seed_spec = str(operator.index(seeds))
        else:
            seed_list = [operator.index(s) for s in seeds]
            if not seed_list:
                raise ValueError("sweep: seeds is an empty list")
            if len(seed_list) == 1:  # one seed in a list is that seed, not a count
                merged["seed"] = seed_list[0]
            else:
                seed_spec = ",".join(str(s) for s in seed_list)
    r = _scalify.sweep({k: _setting_text(v) for k, v in merged.items()}, vary, _sizes("widths", widths), _sizes("depths", depths),
                       recipe_spec, os.fspath(out), seed_spec, progress)
    return SweepResult(
        key=r["key"], values=list(r["values"]), labels=list(r["labels"]),
        cells=[SweepCell(**dict(c)) for c in r["cells"]],
        verdicts={k: SweepVerdict(**dict(v)) for k, v in r["verdicts"].items()},
        report=r["report"])
