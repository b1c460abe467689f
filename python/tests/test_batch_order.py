"""docs/BATCH_ORDER.md's reference (the Python block, run as written) draws the trainer's batches."""

import os
import pathlib

import numpy as np
import pytest

import scalify

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "BATCH_ORDER.md"
FORTUNES = "/usr/share/games/fortunes"


def reference():
    text = DOC.read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    namespace = {}
    exec(compile(code, str(DOC), "exec"), namespace)
    return namespace


@pytest.mark.parametrize("source", ["file", "folder"])
def test_the_documented_batches_are_the_trainers(tmp_path, source):
    if source == "folder":
        if not os.path.isdir(FORTUNES):
            pytest.skip("the default corpus is not installed (scripts/setup.sh)")
        path = FORTUNES  # text files, binary .dat files and .u8 links: every folder rule at work
    else:
        path = str(tmp_path / "text.txt")
        pathlib.Path(path).write_bytes(bytes((i * 7919) % 251 + 1 for i in range(50000)))
    ref = reference()
    train = ref["training_bytes"](path, 0.2)
    for k in (0, 1, 5, 123):
        ids, targets = scalify.training_batch(k, data=path, seed=2**40 + 3, batch=5, seq=24, val_fraction=0.2)
        r_ids, r_targets = ref["batch"](train, k, seed=2**40 + 3, B=5, T=24)
        assert np.array_equal(ids, np.array(r_ids)), k
        assert np.array_equal(targets, np.array(r_targets)), k
