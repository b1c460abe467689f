"""The Python API speaks one language: missing files are FileNotFoundError (an OSError), compare's
progress gets train's values, and errors name Python's keywords, not the CLI's flags."""

import re

import pytest

import scalify

SETTINGS = dict(d_model=32, layers=1, heads=2, seq=16, batch=4, eval_windows=4, eval_every=10, warmup=1)
CLI_FLAG = re.compile(r"(?<![\w-])--[a-z]")  # --resume, --out, --steps, --set, ...


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "text.txt"
    words = "a missing file is an os error and a progress callback gets numbers".split()
    path.write_text(" ".join(words[(i * 5) % len(words)] for i in range(20000)))
    return str(path)


def test_every_missing_input_file_is_file_not_found(tmp_path, corpus):
    missing = tmp_path / "missing"
    cases = {
        "corpus": lambda: scalify.train(str(tmp_path / "a"), steps=1, data=str(missing / "text.txt"), **SETTINGS),
        "corpus, training_batch": lambda: scalify.training_batch(data=str(missing / "text.txt")),
        "token corpus": lambda: scalify.training_batch(data=str(missing / "text.tokens")),
        "recipe file": lambda: scalify.train(str(tmp_path / "b"), recipe=str(missing / "r.json"), steps=1, data=corpus),
        "recipe file, compare": lambda: scalify.compare(str(tmp_path / "c"), recipes=str(missing / "r.json"), steps=1, data=corpus),
        "recipe file, Gpt": lambda: scalify.Gpt(recipe=str(missing / "r.json")),
        "checkpoint": lambda: scalify.load_checkpoint(str(missing / "checkpoint.safetensors")),
        "checkpoint, inspect": lambda: scalify.inspect(str(missing / "checkpoint.safetensors")),
        "run folder, resume": lambda: scalify.train(str(missing / "run"), steps=2, resume=True),
    }
    for what, call in cases.items():
        with pytest.raises(FileNotFoundError, match="missing") as e:
            call()
        assert isinstance(e.value, OSError), what


def test_a_file_that_is_there_but_wrong_is_still_a_value_error(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(ValueError, match="is empty") as e:
        scalify.training_batch(data=str(empty))
    assert not isinstance(e.value, OSError)


def test_compare_progress_gets_trains_values_and_the_run(tmp_path, corpus):
    calls = []

    def progress(step, steps, loss, **run):
        calls.append((step, steps, loss, run))

    rows = scalify.compare(str(tmp_path / "cmp"), recipes="f32,current", steps=3, data=corpus, seeds=[1, 2], speed_rounds=0,
                           progress=progress, **SETTINGS)
    assert len(rows) == 2
    assert len(calls) == 2 * 2 * 3  # recipes x seeds x steps
    for step, steps, loss, run in calls:
        assert type(step) is int and type(steps) is int and steps == 3 and type(loss) is float
        assert set(run) == {"recipe", "seed", "run", "runs", "tokens_per_s", "eta_s", "line"}
        assert run["runs"] == 4 and run["seed"] in (1, 2) and run["recipe"] in ("f32", "current")
        assert run["line"].startswith(f"[{run['run']}/4] {run['recipe']} seed {run['seed']}  step {step}/3")
    assert [c[3]["run"] for c in calls] == [1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4]
    # Each run's losses are the ones its run folder's metrics record, step by step, as train's are.
    by_run = {}
    for step, _, loss, run in calls:
        by_run.setdefault((run["recipe"], run["seed"]), []).append((step, loss))
    for (recipe, seed), seen in by_run.items():
        metrics = scalify.read_metrics(str(tmp_path / "cmp" / "runs" / f"{recipe}_seed{seed}"))
        assert seen == [(m["step"] + 1, m["loss"]) for m in metrics if "loss" in m]  # metrics count from 0, progress steps done


def test_train_progress_still_takes_three_values(tmp_path, corpus):
    seen = []
    scalify.train(str(tmp_path / "t"), steps=2, data=corpus, progress=lambda step, steps, loss: seen.append((step, steps)), **SETTINGS)
    assert seen == [(1, 2), (2, 2)]


def messages_of(calls):
    out = []
    for call in calls:
        with pytest.raises((ValueError, OSError)) as e:
            call()
        out.append(str(e.value))
    return out


def test_errors_from_python_name_keywords_not_cli_flags(tmp_path, corpus):
    run = str(tmp_path / "run")
    scalify.train(run, steps=2, data=corpus, **SETTINGS)
    cmp = str(tmp_path / "cmp")
    scalify.compare(cmp, recipes="f32", steps=1, data=corpus, speed_rounds=0, **SETTINGS)
    again, past, initial, compare_again, seeds = messages_of([
        lambda: scalify.train(run, steps=2, data=corpus, **SETTINGS),
        lambda: scalify.train(run, steps=2, resume=True),
        lambda: scalify.train(run, steps=4, resume=True, save_initial=True),
        lambda: scalify.compare(cmp, recipes="f32", steps=1, data=corpus, **SETTINGS),
        lambda: scalify.compare(str(tmp_path / "c2"), recipes="f32", steps=1, data=corpus, seeds=[1, 1], **SETTINGS),
    ])
    assert "use resume=True to continue it or another out folder" in again
    assert "give steps= above 2" in past
    assert "save_initial=True writes a new run's step 0" in initial
    assert "use resume=True" in compare_again
    assert "seeds '1,1'" in seeds
    for message in (again, past, initial, compare_again, seeds):
        assert not CLI_FLAG.search(message), message
