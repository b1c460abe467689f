"""scalify.sweep: the CLI's sweep from Python, its typed result checked against the run folders."""

import os

import numpy as np
import pytest

import scalify

SETTINGS = dict(d_model=32, layers=1, heads=2, seq=16, batch=4, eval_windows=8, eval_every=8, warmup=2, checkpoint_every=8,
                stats_every=4)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "text.txt"
    words = "the quick brown fox jumps over the lazy dog while scalify counts every bit of it".split()
    path.write_text(" ".join(words[(i * 7) % len(words)] for i in range(20000)))
    return str(path)


def test_sweep_returns_each_cells_loss_its_best_and_the_verdict(tmp_path, corpus):
    out = tmp_path / "sw"
    seen = []
    result = scalify.sweep(out, vary="lr=2^-9:2^-7", widths=[32, 64], steps=8, data=corpus,
                           progress=lambda k, n, loss, **cell: seen.append((k, n, cell["width"], cell["value"])), **SETTINGS)
    assert isinstance(result, scalify.SweepResult)
    assert result.key == "lr" and result.values == [2.0**-9, 2.0**-8, 2.0**-7] and result.labels == ["2^-9", "2^-8", "2^-7"]
    assert len(result.cells) == 6 and [s[0] for s in seen] == [1, 2, 3, 4, 5, 6] and {s[1] for s in seen} == {6}
    assert seen[3][2:] == (64, 2.0**-9)
    assert result.report == os.path.join(str(out), "report.md") and os.path.exists(result.report)
    # Each cell's loss is its run folder's last evaluation; the best is the row's lowest (numpy's argmin).
    best_index = {}
    for width in (32, 64):
        row = [c for c in result.cells if c.width == width]
        for c in row:
            assert c.status == "ok" and c.depth == 1 and c.recipe == "f32"
            metrics = scalify.read_metrics(str(out / "runs" / "f32" / f"w{width}_d1" / f"lr={c.label}"))
            assert c.val_loss == [m["val_loss"] for m in metrics if "val_loss" in m][-1]
        best_index[width] = int(np.argmin([c.val_loss for c in row]))
        assert [c.best for c in row] == [i == best_index[width] for i in range(3)]
    verdict = result.verdicts["f32"]
    moved = abs(best_index[32] - best_index[64])
    assert verdict.widths_steps == moved
    assert verdict.across_widths == ("transfers" if moved <= 1 else f"moves by {moved} steps")
    assert verdict.across_depths == "no verdict (one depth)" and verdict.depths_steps is None
    assert result.losses("f32")[(64, 1)] == [c.val_loss for c in result.cells if c.width == 64]
    # The same call again trains nothing: the run folders stay as they were, the losses come back.
    model = out / "runs" / "f32" / "w32_d1" / "lr=2^-8" / "model.safetensors"
    before = os.stat(model).st_mtime_ns
    again = scalify.sweep(out, vary="lr=2^-9:2^-7", widths=[32, 64], steps=8, data=corpus, **SETTINGS)
    assert os.stat(model).st_mtime_ns == before
    assert [c.val_loss for c in again.cells] == [c.val_loss for c in result.cells]


def test_sweep_argument_errors(tmp_path, corpus):
    def run(**kw):
        args = dict(vary="lr=2^-9:2^-8", steps=2, data=corpus, **SETTINGS)
        args.update(kw)
        return scalify.sweep(tmp_path / "bad", **args)

    with pytest.raises(ValueError, match="unknown key 'learning_rate'"):
        run(vary="learning_rate=1,2")
    with pytest.raises(ValueError, match="'fast' is not a number"):
        run(vary="lr=0.001,fast")
    with pytest.raises(ValueError, match="at least 2 values"):
        run(vary="lr=0.001")
    with pytest.raises(ValueError, match="empty range"):
        run(vary="lr=2^-2:2^-6")
    with pytest.raises(ValueError, match="width 24 is not a multiple of the head dimension 16"):
        run(widths=[32, 24])
    with pytest.raises(TypeError, match="vary"):
        run(vary=0.001)
    with pytest.raises(TypeError, match="widths"):
        run(widths="32,64")
    with pytest.raises(TypeError):
        run(depths=[1.5])
    with pytest.raises(ValueError, match="empty"):
        run(widths=[])
    assert not os.path.exists(tmp_path / "bad")
