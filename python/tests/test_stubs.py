"""The package's type stubs: mypy resolves every name the package exports, the `unit` submodule's
ops included, with the stubs' own types (scalify._scalify.Tensor), as a user's code sees them."""

import os
import subprocess
import sys
import textwrap

import pytest

import scalify

pytest.importorskip("mypy")


def _mypy_strict(tmp_path, code):
    """mypy --strict on a user's file: the scalify that this Python imports (installed, or on PYTHONPATH)."""
    path = tmp_path / "user_code.py"
    path.write_text(textwrap.dedent(code))
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(scalify.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([package_parent, os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--cache-dir", str(tmp_path / "cache"),
                          str(path)], capture_output=True, text=True, cwd=tmp_path, env=env)
    return run.returncode, (run.stdout + run.stderr).replace("builtins.", "")  # older mypy: builtins.int


def test_unit_submodule_ops_resolve_to_the_stubs_tensor(tmp_path):
    rc, out = _mypy_strict(tmp_path, """
        import numpy as np
        import scalify
        from scalify import unit

        x = scalify.Tensor(np.ones((2, 3), dtype=np.float32))
        y: scalify.Tensor = unit.gelu(unit.scaled(x, 2.0))
        reveal_type(unit.gelu)
    """)
    assert rc == 0, out
    assert 'Revealed type is "def (x: scalify._scalify.Tensor, constrained: bool =) -> scalify._scalify.Tensor"' in out


def test_a_wrong_argument_type_is_reported(tmp_path):
    # The stubs are read (not Any): a str where a Tensor goes is an error.
    rc, out = _mypy_strict(tmp_path, """
        from scalify import unit

        unit.relu("not a tensor")
    """)
    assert rc == 1, out
    assert 'Argument 1 to "relu" has incompatible type "str"; expected "Tensor"' in out


def test_training_wrappers_are_annotated(tmp_path):
    rc, out = _mypy_strict(tmp_path, """
        import scalify

        reveal_type(scalify.training_batch)
        reveal_type(scalify.read_metrics)
    """)
    assert rc == 0, out
    assert "def (index: int =, **settings: object) -> tuple[numpy.ndarray[" in out  # numpy's own spelling follows
    assert "def (run_dir: str) -> list[dict[str, Any]]" in out
