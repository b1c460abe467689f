"""The install's reuse of a prior build (SCALIFY_LIBRARY_DIR, cmake/library_dir.cmake): a tree that
cannot serve is refused at configure time with the reason, never linked."""

import shutil
import subprocess
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None or not (CHECKOUT / "CMakeLists.txt").exists(),
                                reason="needs cmake and the checkout's CMakeLists.txt")


def _configure_python_build(tmp_path, library_dir):
    """The configure step of pip install . (pyproject.toml's defines) with SCALIFY_LIBRARY_DIR given."""
    run = subprocess.run(["cmake", "-S", str(CHECKOUT), "-B", str(tmp_path / "py-build"), "-DSCALIFY_BUILD_PYTHON=ON",
                          "-DSCALIFY_BUILD_TESTS=OFF", "-DSCALIFY_BUILD_APPS=OFF", "-DSCALIFY_BUILD_BENCH=OFF",
                          f"-DSCALIFY_LIBRARY_DIR={library_dir}"], capture_output=True, text=True)
    return run.returncode, " ".join((run.stdout + run.stderr).split())  # CMake wraps its messages


def _fake_tree(tmp_path, source_dir, pic):
    """A tree as cmake/build_tree_export.cmake leaves it, with the facts the check reads."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "CMakeCache.txt").write_text("")
    (tree / "scalifyBuildTree.cmake").write_text(
        f'set(SCALIFY_TREE_SOURCE_DIR "{source_dir}")\nset(SCALIFY_TREE_LIBRARY "{tree}/src/libscalify.a")\n'
        f'set(SCALIFY_TREE_PIC "{pic}")\nset(SCALIFY_TREE_BUILD_TYPE "Release")\nset(SCALIFY_TREE_CXX_COMPILER "")\n')
    return tree


def test_a_folder_that_is_not_a_build_tree_is_refused(tmp_path):
    rc, out = _configure_python_build(tmp_path, tmp_path / "nothing_here")
    assert rc != 0
    assert "cannot be used: not a configured CMake build tree" in out


def test_a_tree_of_another_checkout_is_refused(tmp_path):
    other = tmp_path / "other_checkout"
    other.mkdir()
    rc, out = _configure_python_build(tmp_path, _fake_tree(tmp_path, other, 1))
    assert rc != 0
    assert f"it was configured from {other}, not from this checkout" in out


def test_a_library_without_position_independent_code_is_refused(tmp_path):
    rc, out = _configure_python_build(tmp_path, _fake_tree(tmp_path, CHECKOUT, 0))
    assert rc != 0
    assert "its library is built without position-independent code" in out
