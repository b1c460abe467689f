"""The examples and the README's Python quickstart run unchanged with every warning an error."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples" / "python").glob("*.py"))


def run_python(args, cwd):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))  # the scalify under test
    return subprocess.run([sys.executable, "-W", "error", *args], cwd=cwd, env=env, capture_output=True, text=True)


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.name for e in EXAMPLES])
def test_example_runs_with_warnings_as_errors(example, tmp_path):
    done = run_python([str(example)], tmp_path)
    assert done.returncode == 0, done.stderr


def test_readme_quickstart_runs_with_warnings_as_errors(tmp_path):
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("\n## Python\n") :]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block, "the README's Python section has no python block"
    script = tmp_path / "quickstart.py"
    script.write_text(block.group(1))
    done = run_python([str(script)], tmp_path)
    assert done.returncode == 0, done.stderr
