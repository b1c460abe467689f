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


def interrupt(code, under_way, what):
    """Runs `code` in a child Python, sends it Ctrl-C once its first line says `under_way`, and
    checks that it stopped with KeyboardInterrupt. The wait after the signal only guards against a
    hang: one step of the tiny model, however slow the host, is far below it."""
    import signal
    import sys

    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert under_way(child.stdout.readline())  # the event: the work is under way
    child.send_signal(signal.SIGINT)
    try:
        _, err = child.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        child.kill()
        raise AssertionError(f"Ctrl-C did not stop {what}")
    assert child.returncode != 0 and "KeyboardInterrupt" in err, err


def test_ctrl_c_stops_training_between_steps_and_the_run_resumes(tmp_path, corpus):
    out = str(tmp_path / "interrupted")
    code = (
        "import scalify, sys\n"
        f"scalify.train({out!r}, steps=100000, data={corpus!r}, checkpoint_every=5, "
        "progress=lambda s, n, l: print(s, flush=True) if s == 12 else None, "
        + ", ".join(f"{k}={v!r}" for k, v in SETTINGS.items() if k != "eval_every")
        + ", eval_every=100000)\n"
    )
    interrupt(code, lambda line: line.strip() == "12", "the training")
    # The run stopped between steps: its last checkpoint is whole, and it resumes from it.
    run = scalify.train(out, steps=30, data=corpus, resume=True, **{k: v for k, v in SETTINGS.items()})
    assert run["steps"] == 30


HOSTILE_NAMES = ["../precious", "/", "..", ".", "", "a/b/c", "..\\precious", "x.json", "~", "name\0nul", "\u00e9t\u00e9 \U0001f600"]


def test_a_recipe_object_goes_into_its_run_folder_whatever_its_name(tmp_path, corpus):
    names = HOSTILE_NAMES + [str(tmp_path / "precious"), str(tmp_path / "runs" / "0" / "config")]
    for i, name in enumerate(names):
        before = {p for p in tmp_path.rglob("*")}
        r = scalify.preset("current")
        r.name = name
        run_dir = tmp_path / "runs" / str(i)
        scalify.train(str(run_dir), recipe=r, steps=1, data=corpus, **SETTINGS)
        outside = [p for p in set(tmp_path.rglob("*")) - before if run_dir not in p.parents and p != run_dir]
        assert outside == [] or outside == [tmp_path / "runs"], (name, outside)
        assert scalify.Recipe.from_json((run_dir / "recipe.json").read_text()) == r, name
        assert f"recipe = '{run_dir / 'recipe.json'}'" in (run_dir / "config.toml").read_text(), name
    # Another run's recipe.json is never overwritten; nor is a finished run's.
    other = scalify.preset("mxfp8")
    written = (tmp_path / "runs" / "0" / "recipe.json").read_text()
    with pytest.raises(ValueError, match="holds another recipe"):
        scalify.train(str(tmp_path / "runs" / "0"), recipe=other, steps=1, data=corpus, **SETTINGS)
    same = scalify.Recipe.from_json(written)
    with pytest.raises(ValueError, match="already holds a run"):
        scalify.train(str(tmp_path / "runs" / "0"), recipe=same, steps=1, data=corpus, **SETTINGS)
    assert (tmp_path / "runs" / "0" / "recipe.json").read_text() == written


def test_a_nul_in_a_path_or_setting_is_refused_before_any_file_is_touched(tmp_path, corpus):
    # C and the file system read NUL as the end: "a\0b" would be the folder "a".
    out, there = str(tmp_path / "a\0b"), str(tmp_path / "fine")
    calls = [lambda: scalify.train(out, steps=1, data=corpus),
             lambda: scalify.train(out, recipe=scalify.preset("current"), steps=1, data=corpus),
             lambda: scalify.train(out, resume=True),
             lambda: scalify.train(there, steps=1, data=corpus + "\0.txt"),
             lambda: scalify.train(there, steps=1, data=corpus, **{"steps\0": 2}),
             lambda: scalify.compare(out, recipes="f32", steps=1, data=corpus),
             lambda: scalify.compare(there, recipes="f32,\0current", steps=1, data=corpus),
             lambda: scalify.load_checkpoint(out),
             lambda: scalify.inspect(out),
             lambda: scalify.Gpt("f32", data="x\0")]
    for call in calls:
        with pytest.raises(ValueError, match=r"NUL character: '.*\\0"):
            call()
    assert list(tmp_path.iterdir()) == []


class StopHere(Exception):
    pass


def stop_at(step):
    def progress(s, steps, loss):
        if s == step:
            raise StopHere(s)
    return progress


def test_resume_continues_under_the_runs_own_config_and_recipe_bit_for_bit(tmp_path, corpus):
    # Not the defaults: a recipe with state (delayed scaling's amax history), another shape, another lr.
    own = dict(SETTINGS, d_model=48, layers=3, seq=24, lr=0.01, checkpoint_every=5)
    whole = scalify.train(str(tmp_path / "whole"), recipe="delayed", steps=12, data=corpus, **own)
    with pytest.raises(StopHere):
        scalify.train(str(tmp_path / "cut"), recipe="delayed", steps=12, data=corpus, progress=stop_at(7), **own)
    assert scalify.load_checkpoint(str(tmp_path / "cut" / "checkpoint.safetensors"))[1]["step"] == "5"
    resumed = scalify.train(str(tmp_path / "cut"), resume=True)  # nothing repeated
    assert resumed["steps"] == 12 and "resume at step 5" in (tmp_path / "cut" / "train.log").read_text()
    assert losses(resumed["metrics"]) == losses(whole["metrics"]) and resumed["val_loss"] == whole["val_loss"]
    a, _ = scalify.load_checkpoint(str(tmp_path / "whole" / "model.safetensors"))
    b, _ = scalify.load_checkpoint(str(tmp_path / "cut" / "model.safetensors"))
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    config = (tmp_path / "cut" / "config.toml").read_text()
    assert config == (tmp_path / "whole" / "config.toml").read_text().replace(str(tmp_path / "whole"), str(tmp_path / "cut"))
    assert "lr = 0.01\n" in config and "recipe = 'delayed'\n" in config and "d_model = 48\n" in config
    # Keys given on a resume override the run's (steps to train further); the run keeps its recipe and shape.
    assert scalify.train(str(tmp_path / "cut"), resume=True, steps=14)["steps"] == 14
    assert "lr = 0.01\n" in (tmp_path / "cut" / "config.toml").read_text()
    refusals = [(dict(recipe="f32"), "a run keeps its recipe"), (dict(recipe=scalify.preset("current")), "a run keeps its recipe"),
                (dict(d_model=32), "d_model = 48, not 32"), (dict(layers=2), "layers = 3, not 2"), (dict(heads=4), "heads = 2, not 4"),
                (dict(seq=16), "seq = 24, not 16"), (dict(swiglu=True), "swiglu = false, not true"), (dict(vocab=300), "vocab"),
                (dict(lr=-1.0), "lr"), (dict(steps=10), "give steps= above 14"), (dict(no_such_key=1), "no_such_key")]
    for given, message in refusals:
        with pytest.raises(ValueError, match=message):
            scalify.train(str(tmp_path / "cut"), resume=True, **dict({"steps": 16}, **given))
    assert scalify.train(str(tmp_path / "cut"), resume=True, steps=16, recipe="delayed")["steps"] == 16  # the run's own: accepted
    with pytest.raises(FileNotFoundError, match="does not exist"):
        scalify.train(str(tmp_path / "never"), resume=True)


def rows_of(rows):
    return rows.to_dict("records") if hasattr(rows, "to_dict") else rows


def test_an_error_in_the_compare_callback_stops_the_comparison_and_it_resumes(tmp_path, corpus):
    settings = dict(SETTINGS, checkpoint_every=2)
    whole = rows_of(scalify.compare(str(tmp_path / "whole"), recipes="f32,current", steps=8, data=corpus, speed_rounds=0, **settings))
    seen = []

    def progress(step, steps, loss, *, run, line, **_):
        seen.append(line)
        if run == 2 and step == 5:
            raise StopHere(line)

    out = tmp_path / "cut"
    with pytest.raises(StopHere):
        scalify.compare(str(out), recipes="f32,current", steps=8, data=corpus, speed_rounds=0, progress=progress, **settings)
    assert seen[-1].startswith("[2/2] current  step 5/")  # nothing ran after the error
    assert (out / "runs" / "f32" / "outcome.json").exists() and not (out / "runs" / "current" / "outcome.json").exists()
    rows = rows_of(scalify.compare(str(out), resume=True))
    assert "resume at step 4" in (out / "runs" / "current" / "train.log").read_text()
    assert [r["status"] for r in rows] == ["ok", "ok"]
    assert [r["val_loss"] for r in rows] == [r["val_loss"] for r in whole]


def test_ctrl_c_stops_a_comparison_and_it_resumes(tmp_path, corpus):
    out = str(tmp_path / "interrupted")
    code = (
        "import scalify\n"
        f"scalify.compare({out!r}, recipes='f32,current', steps=40, data={corpus!r}, speed_rounds=0, checkpoint_every=5, "
        "progress=lambda step, steps, loss, line, **_: print(line, flush=True) if line.startswith('[1/2] f32  step 12/') else None, "
        + ", ".join(f"{k}={v!r}" for k, v in SETTINGS.items())
        + ")\n"
    )
    interrupt(code, lambda line: line.startswith("[1/2] f32  step 12/"), "the comparison")
    assert not os.path.exists(os.path.join(out, "runs", "f32", "outcome.json"))  # no failed row, no next recipe
    assert not os.path.exists(os.path.join(out, "runs", "current"))
    rows = rows_of(scalify.compare(out, resume=True))
    assert [r["status"] for r in rows] == ["ok", "ok"] and rows[0]["steps"] == 40
    assert "resume at step" in open(os.path.join(out, "runs", "f32", "train.log")).read()


def test_a_model_too_large_for_memory_is_refused_by_name():
    for shape in (dict(d_model=65536), dict(d_model=4096, layers=1024)):
        with pytest.raises(ValueError, match="more than the .* of memory this process may use"):
            scalify.Gpt("f32", **shape)
    with pytest.raises(ValueError, match="d_model"):
        scalify.Gpt("f32", d_model=-3)


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


def test_inspect_judges_each_moment_against_its_own_layout(tmp_path, corpus):
    # coat's v codes are unsigned E4M4 (largest 480, past E4M3's 448): none clip in their own range.
    run = scalify.train(str(tmp_path / "coat"), recipe="coat", steps=3, data=corpus, **SETTINGS)
    r = scalify.inspect(run["run_dir"])
    by_kind = {}
    for t in r["tensors"]:
        by_kind.setdefault(t["kind"], set()).add((t["storage"], t["range"]))
        if t["kind"] in ("first_moment", "second_moment"):
            assert t["clipped"] == 0, t["name"]
    assert by_kind["weight"] == {("f32", "e4m3")}
    assert by_kind["first_moment"] == {("e4m3", "e4m3")}
    assert by_kind["second_moment"] == {("u8", "e4m4 (unsigned)")}
    v = next(t for t in r["tensors"] if t["kind"] == "second_moment" and t["name"] == "wte")
    assert v["exponents"].max() == 8  # codes in [256, 480]


def test_file_errors_are_os_errors(tmp_path, corpus):
    with pytest.raises(OSError, match="cannot open"):
        scalify.load_checkpoint(str(tmp_path / "missing.safetensors"))
    with pytest.raises(OSError, match="missing.json"):
        scalify.train(str(tmp_path / "r"), recipe=str(tmp_path / "missing.json"), steps=1, data=corpus)
    with pytest.raises(ValueError, match="d_model"):  # a bad value is no file error
        scalify.train(str(tmp_path / "v"), steps=1, data=corpus, d_model=0)
