"""saegeo.runtime, the one home of the process settings: each does what it says and undoes what it should."""

import os
import subprocess
import sys

import torch
from threadpoolctl import threadpool_info

from saegeo.runtime import glibc, keep_freed_memory, single_threaded


def test_single_threaded_limits_torch_and_blas_then_restores():
    torch.set_num_threads(2)
    with single_threaded():
        assert torch.get_num_threads() == 1
        assert all(pool["num_threads"] == 1 for pool in threadpool_info() if pool["user_api"] == "blas")
    assert torch.get_num_threads() == 2


def _policy_after(env: dict[str, str], preload_torch: bool) -> str:
    code = (
        ("import torch\n" if preload_torch else "")
        + "import os\nfrom saegeo.runtime import quiet_openmp_workers\nquiet_openmp_workers()\n"
        + "print(os.environ.get('OMP_WAIT_POLICY', '<unset>'))"
    )
    base = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_quiet_openmp_workers_sets_passive_only_before_torch_and_only_when_unset():
    assert _policy_after({}, preload_torch=False) == "PASSIVE"
    assert _policy_after({"OMP_WAIT_POLICY": "ACTIVE"}, preload_torch=False) == "ACTIVE"  # the user's choice stands
    assert _policy_after({}, preload_torch=True) == "<unset>"  # libgomp has read it already: setting it would lie


def test_keep_freed_memory_reports_whether_glibc_took_it():
    assert keep_freed_memory() is (glibc() is not None)
