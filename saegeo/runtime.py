"""How saegeo sets up the process it runs in: threads, the OpenMP wait policy, the C heap. The one home of system glue.

The math and the commands say what they want (one BLAS thread around a chain of small steps, a heap that keeps
its pages); the how (threadpoolctl, environment variables, glibc's mallopt and malloc_trim through ctypes) lives
here, so that ``saegeo.geometry`` stays pure math. Torch-free at import: the command line calls it before torch
loads. Measurements behind each setting: benchmarks/README.md#runtime-settings.

Public API
----------
``single_threaded()``        a with-block in which torch and numpy's / scipy's BLAS run on one thread.
``quiet_openmp_workers()``   OMP_WAIT_POLICY=PASSIVE for this process, unless set already or torch is loaded.
``glibc()``                  the C library through ctypes when it is glibc, else None.
``keep_freed_memory()``      raise glibc's mmap and trim thresholds: the heap keeps large freed buffers for reuse.
``release_free_heap()``      hand the heap's free pages back to the kernel (malloc_trim(0)).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def single_threaded() -> Iterator[None]:
    """torch and numpy's / scipy's BLAS on one thread inside the block, their thread counts restored after it.

    Why: in a chain of small steps (LAPACK's tridiagonalisation, many tiny matmuls) multithreaded BLAS spin-waits
    between the steps, and on a busy machine that costs ten times the work or more."""
    import torch
    from threadpoolctl import threadpool_limits

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpool_limits(limits=1, user_api="blas"):
            yield
    finally:
        torch.set_num_threads(threads)


def quiet_openmp_workers() -> None:
    """OMP_WAIT_POLICY=PASSIVE for this process's torch, unless the user set a policy or torch is loaded already.

    Why: after each parallel region libgomp's idle workers spin on cores that the single-threaded parts of the
    geometry pass could use; the geometry commands save CPU with them asleep, training loses wall time, so the
    command line asks for it per command. libgomp reads the variable once, when torch loads it: hence before any
    heavy import."""
    if "torch" not in sys.modules:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@functools.cache
def glibc() -> Any:
    """The C library as ctypes sees it when it is glibc (malloc_trim, mallopt), else None (not Linux, or another
    C library): the trainer's and the encode blocks' heap settings both go through it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim, libc.mallopt  # noqa: B018  (glibc's, absent from musl and others)
        return libc
    except (OSError, AttributeError):
        return None


def keep_freed_memory() -> bool:
    """Raise glibc's mmap threshold to 1 GiB and its trim threshold to 2 GiB (mallopt M_MMAP_THRESHOLD = −3,
    M_TRIM_THRESHOLD = −1; process-wide, as the environment variables MALLOC_MMAP_THRESHOLD_ /
    MALLOC_TRIM_THRESHOLD_). False where libc is not glibc.

    Why: glibc hands every freed block above its mmap threshold (≤ 32 MiB) back to the OS, so each training step's
    (batch × d_sae) buffers would be page-faulted in again; with the thresholds raised the heap keeps and reuses
    them."""
    libc = glibc()
    return libc is not None and bool(libc.mallopt(-3, 1 << 30)) and bool(libc.mallopt(-1, 1 << 31))


def release_free_heap() -> None:
    """Hand the C heap's free pages back to the kernel (glibc malloc_trim(0); a no-op elsewhere).

    Why: an encode block's mid-size temporaries (its (rows × d_sae) boolean masks, below glibc's mmap threshold)
    are carved from the heap between what the batch keeps, so every block leaves a hole the next cannot reuse;
    trimming after each block keeps the heap flat."""
    libc = glibc()
    if libc is not None:
        libc.malloc_trim(0)
