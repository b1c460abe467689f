"""Training from Python is the CLI's training: the same config gives the same losses, bit for bit."""

import os
import subprocess

import numpy as np
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


def test_save_initial_writes_the_weights_before_the_first_update(tmp_path, corpus):
    run = scalify.train(str(tmp_path / "init"), steps=3, data=corpus, save_initial=True, **SETTINGS)
    initial, meta = scalify.load_checkpoint(os.path.join(run["run_dir"], "initial.safetensors"))
    final, _ = scalify.load_checkpoint(os.path.join(run["run_dir"], "model.safetensors"))
    assert meta["step"] == "0"
    model = scalify.Gpt("f32", **SETTINGS)  # the seed's initialisation
    for name, value in model.parameters().items():
        assert np.array_equal(initial["param." + name], value.numpy()), name
    assert not np.array_equal(initial["param.wte"], final["param.wte"])


def test_compare_returns_its_rows_and_checkpoints_load(tmp_path, corpus):
    rows = scalify.compare(str(tmp_path / "cmp"), recipes="f32,nvfp4", steps=6, data=corpus, **SETTINGS)
    rows = rows.to_dict("records") if hasattr(rows, "to_dict") else rows
    assert [r["recipe"] for r in rows] == ["f32", "nvfp4"]
    assert rows[0]["val_delta"] == 0 and rows[1]["baseline"] == "f32" and rows[1]["status"] == "ok"
    assert abs(rows[1]["val_loss"] - rows[0]["val_loss"] - rows[1]["val_delta"]) < 1e-12
    assert os.path.exists(tmp_path / "cmp" / "report.md")
    tensors, meta = scalify.load_checkpoint(str(tmp_path / "cmp" / "runs" / "f32" / "checkpoint.safetensors"))
    assert tensors["param.wte"].shape == (256, SETTINGS["d_model"]) and tensors["param.wte"].dtype.name == "float32"
    assert "config" in meta and "recipe" in meta


def test_compare_under_several_seeds_gives_intervals_and_verdicts(tmp_path, corpus):
    rows = scalify.compare(str(tmp_path / "seeds"), recipes="current", steps=4, data=corpus, seeds=2, speed_rounds=1, **SETTINGS)
    rows = rows.to_dict("records") if hasattr(rows, "to_dict") else rows
    assert [r["seeds"] for r in rows] == [[1, 2], [1, 2]]
    current = rows[1]
    assert current["val_delta_ci95"] > 0 and current["seed_ci95"] > 0 and current["window_ci95"] > 0
    assert current["verdict"] in ("better than baseline", "not distinguishable from baseline", "within +0.05 of baseline",
                                  "inconclusive", "worse")
    assert rows[0]["speed_vs_f32"] == 1.0 and current["speed_vs_f32"] > 0  # timed interleaved, one round
    assert os.path.isdir(tmp_path / "seeds" / "runs" / "current_seed2")
    # A list of one seed is that seed: the run equals the two-seed comparison's run under seed 2.
    one = scalify.compare(str(tmp_path / "seed2"), recipes="current", steps=4, data=corpus, seeds=[2], speed_rounds=0, **SETTINGS)
    one = one.to_dict("records") if hasattr(one, "to_dict") else one
    assert one[1]["seeds"] == [2] and os.path.isdir(tmp_path / "seed2" / "runs" / "current")
    run2 = scalify.read_metrics(str(tmp_path / "seeds" / "runs" / "current_seed2"))
    assert one[1]["val_loss"] == [m["val_loss"] for m in run2 if "val_loss" in m][-1]
    with pytest.raises(ValueError, match="given twice"):
        scalify.compare(str(tmp_path / "bad"), recipes="current", steps=4, data=corpus, seeds=[1, 1], **SETTINGS)
    with pytest.raises(TypeError, match="seeds"):
        scalify.compare(str(tmp_path / "bad2"), recipes="current", steps=4, data=corpus, seeds="3", **SETTINGS)
    with pytest.raises(ValueError, match="empty"):
        scalify.compare(str(tmp_path / "bad3"), recipes="current", steps=4, data=corpus, seeds=[], **SETTINGS)
    with pytest.raises(ValueError, match="disagree"):
        scalify.compare(str(tmp_path / "bad4"), recipes="current", steps=4, data=corpus, seeds=[3], seed=4, **SETTINGS)


def test_ctrl_c_stops_training_between_steps_and_the_run_resumes(tmp_path, corpus):
    import signal
    import sys
    import time

    out = str(tmp_path / "interrupted")
    code = (
        "import scalify, sys\n"
        f"scalify.train({out!r}, steps=100000, data={corpus!r}, checkpoint_every=5, "
        "progress=lambda s, n, l: print(s, flush=True) if s == 12 else None, "
        + ", ".join(f"{k}={v!r}" for k, v in SETTINGS.items() if k != "eval_every")
        + ", eval_every=100000)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "12"  # training is under way
    child.send_signal(signal.SIGINT)
    try:
        _, err = child.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        child.kill()
        raise AssertionError("Ctrl-C did not stop the training")
    assert child.returncode != 0 and "KeyboardInterrupt" in err, err
    # The run stopped between steps: its last checkpoint is whole, and it resumes from it.
    run = scalify.train(out, steps=30, data=corpus, resume=True, **{k: v for k, v in SETTINGS.items()})
    assert run["steps"] == 30


def test_inspect_gives_histograms_as_arrays(tmp_path, corpus):
    run = scalify.train(str(tmp_path / "seen"), recipe="scalify_fp16_1", steps=3, data=corpus, **SETTINGS)
    r = scalify.inspect(run["run_dir"], format="f16")
    assert r["recipe"] == "scalify_fp16_1" and r["step"] == 3 and r["format"] == "f16"
    kinds = {t["kind"] for t in r["tensors"]}
    assert kinds == {"activation", "activation_grad", "weight", "weight_grad"}
    for t in r["tensors"]:
        assert t["counts"].sum() == t["count"] - t["zeros"] - t["nonfinite"], t["name"]
        assert t["underflow"] + t["subnormal"] + t["normal"] + t["clipped"] == t["count"] - t["zeros"] - t["nonfinite"]
    qkv = next(t for t in r["tensors"] if t["name"] == "h0.attn.qkv" and t["kind"] == "activation")
    assert qkv["storage"] == "f16"  # SCALIFY holds activations in f16


def test_file_errors_are_os_errors(tmp_path, corpus):
    with pytest.raises(OSError, match="cannot open"):
        scalify.load_checkpoint(str(tmp_path / "missing.safetensors"))
    with pytest.raises(OSError, match="missing.json"):
        scalify.train(str(tmp_path / "r"), recipe=str(tmp_path / "missing.json"), steps=1, data=corpus)
    with pytest.raises(ValueError, match="d_model"):  # a bad value is no file error
        scalify.train(str(tmp_path / "v"), steps=1, data=corpus, d_model=0)
