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


def tiny_lm(seed: int):
    """A 2-layer, d_model 16 HookedTransformer with random weights (this seed) and MiniLM's tokenizer: a real model
    for the splice tests that runs in milliseconds."""
    from saegeo.activations.models import _load_tokenizer, _quiet_transformers, from_config, minilm_path

    _quiet_transformers()
    cfg = {
        "n_layers": 2,
        "d_model": 16,
        "d_head": 4,
        "n_heads": 4,
        "d_mlp": 32,
        "n_ctx": 32,
        "d_vocab": 30522,
        "act_fn": "gelu",
        "normalization_type": "LN",
        "seed": seed,
    }
    return from_config(cfg, tokenizer=_load_tokenizer(minilm_path()), name="tiny")


def run_forked(target, *args, timeout: float = 300) -> int | None:
    """Run target(*args) in a forked child (it inherits the parent's loaded model); its exit code
    (137 when SAEGEO_CRASH_AT killed it)."""
    p = mp.get_context("fork").Process(target=target, args=args)
    p.start()
    p.join(timeout)
    return p.exitcode
