"""Training from Python is the CLI's training: the same config gives the same losses, bit for bit."""

import os
import subprocess

import pytest

import scalify

CLI = os.environ.get("SCALIFY_CLI", os.path.join(os.path.dirname(__file__), "..", "..", "build", "apps", "scalify", "scalify"))
SETTINGS = dict(d_model=32, layers=2, heads=2, seq=16, batch=4, eval_windows=8, eval_every=10, warmup=5)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "text.txt"
    words = "the quick brown fox jumps over the lazy dog while scalify counts every bit of it".split()
    path.write_text(" ".join(words[(i * 7) % len(words)] for i in range(20000)))
    return str(path)


def losses(metrics):
    return [m["loss"] for m in metrics if "loss" in m]


@pytest.mark.skipif(not os.path.exists(CLI), reason="the CLI is not built (scripts/build.sh)")
def test_python_training_equals_the_cli(tmp_path, corpus):
    seen = []
    run = scalify.train(str(tmp_path / "py"), recipe="current", steps=20, data=corpus,
                        progress=lambda step, steps, loss: seen.append((step, steps)), **SETTINGS)
    sets = [a for k, v in SETTINGS.items() for a in ("--set", f"{k}={v}")]
    subprocess.run([CLI, "train", "--recipe", "current", "--steps", "20", "--data", corpus, "--out", str(tmp_path / "cli"), *sets],
                   check=True, capture_output=True)
    cli = scalify.read_metrics(str(tmp_path / "cli"))
    assert losses(run["metrics"]) == losses(cli) and len(losses(cli)) == 20
    assert run["val_loss"] == [m["val_loss"] for m in cli if "val_loss" in m][-1]
    assert seen[-1] == (20, 20) and len(seen) == 20


def test_a_python_recipe_trains_and_errors_are_value_errors(tmp_path, corpus):
    r = scalify.preset("mxfp4")
    r.name = "my_mxfp4"
    run = scalify.train(str(tmp_path / "mine"), recipe=r, steps=10, data=corpus, **SETTINGS)
    assert run["steps"] == 10 and run["val_loss"] < 5.6  # below ln(256): it learnt
    assert os.path.exists(os.path.join(run["run_dir"], "checkpoint.safetensors"))
    with pytest.raises(ValueError, match="d_model"):
        scalify.train(str(tmp_path / "bad"), steps=1, data=corpus, d_model=-3)
