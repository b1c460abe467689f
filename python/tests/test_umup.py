"""u-μP from Python: recipe="umup" trains the u-μP model (its hyperparameters are train keys), and its loss falls."""

import pytest

import scalify

SETTINGS = dict(d_model=32, layers=2, heads=2, seq=16, batch=8, eval_windows=8, eval_every=20, warmup=5, lr=2**-5, min_lr=2**-5 / 10)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "text.txt"
    words = "the quick brown fox jumps over the lazy dog while scalify counts every bit of it".split()
    path.write_text(" ".join(words[(i * 7) % len(words)] for i in range(20000)))
    return str(path)


def test_umup_trains_and_its_loss_falls(tmp_path, corpus):
    run = scalify.train(str(tmp_path / "umup"), recipe="umup", steps=40, data=corpus, residual_mult=0.5, **SETTINGS)
    losses = [m["loss"] for m in run["metrics"] if "loss" in m]
    assert len(losses) == 40
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert first > 5.0  # about ln(256) = 5.55 at initialisation: unit-scaled logits start near zero
    assert last < first - 1.0, (first, last)
    with open(tmp_path / "umup" / "train.log") as f:
        assert "u-μP learning-rate factors: wte" in f.read()


def test_a_bad_umup_hyperparameter_is_a_value_error(tmp_path, corpus):
    with pytest.raises(ValueError, match="attn_mult"):
        scalify.train(str(tmp_path / "bad"), recipe="umup", steps=1, data=corpus, attn_mult=0, **SETTINGS)
