"""OpenMP's wait (issue 42, src/scalify/platform/openmp_wait.hpp): the libgomp that `import scalify`
loads spins scalify's count before it sleeps, unless the user chose. OMP_DISPLAY_ENV=verbose makes
libgomp print its settings as it loads."""
import os
import re
import subprocess
import sys

import pytest


def spin_count(**settings):
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(settings, OMP_DISPLAY_ENV="verbose")
    err = subprocess.run([sys.executable, "-c", "import scalify"], env=env, capture_output=True, text=True, check=True).stderr
    return re.findall(r"GOMP_SPINCOUNT = '([0-9]+)'", err)


@pytest.mark.parametrize("settings, wanted", [({}, "1000"), ({"GOMP_SPINCOUNT": "7"}, "7"),
                                              ({"OMP_WAIT_POLICY": "passive"}, "0"),
                                              ({"OMP_WAIT_POLICY": "active"}, "30000000000")])
def test_libgomp_spins_scalifys_count_or_the_users(settings, wanted):
    assert spin_count(**settings) == [wanted]
