"""Helpers shared by several test modules (not a test module itself)."""

import multiprocessing as mp

import torch

from saegeo.sae.model import SAE, SAEConfig


def identity_sae(d: int) -> SAE:
    """An exact identity "SAE": relu(x) − relu(−x) = x with W_enc = [I, −I], W_dec = [I; −I], no biases."""
    sae = SAE(SAEConfig(d_in=d, d_sae=2 * d, activation="relu"))
    with torch.no_grad():
        eye = torch.eye(d)
        sae.W_enc.copy_(torch.cat([eye, -eye], 1))
        sae.W_dec.copy_(torch.cat([eye, -eye], 0))
        sae.b_enc.zero_()
        sae.b_dec.zero_()
    return sae.eval()


def run_forked(target, *args, timeout: float = 300) -> int | None:
    """Run target(*args) in a forked child (it inherits the parent's loaded model); its exit code
    (137 when SAEGEO_CRASH_AT killed it)."""
    p = mp.get_context("fork").Process(target=target, args=args)
    p.start()
    p.join(timeout)
    return p.exitcode
