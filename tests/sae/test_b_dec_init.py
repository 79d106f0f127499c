"""Issue 14: b_dec's mean comes from a uniform sample across all shards (or all training rows), not a prefix."""

import torch

from saegeo.activations.store import write_store
from saegeo.sae.train import TrainConfig, train_sae


def _drifting_rows(n: int = 40_000, d: int = 32, seed: int = 0) -> torch.Tensor:
    """Rows whose mean drifts along the store (documents written in order): μ(t) = μ₀ + 3·(t − ½)·v, t = i/n."""
    g = torch.Generator().manual_seed(seed)
    mu0 = torch.randn(d, generator=g)
    v = torch.randn(d, generator=g)
    v *= mu0.norm() / v.norm()
    t = torch.arange(n, dtype=torch.float32)[:, None] / n
    return mu0 + 3.0 * (t - 0.5) * v + torch.randn(n, d, generator=g)


def _cfg(**kw) -> TrainConfig:
    base = dict(
        arch="topk",
        d_sae=64,
        arch_options={"topk": {"k": 4}},
        lr=1e-3,
        batch_tokens=128,
        total_tokens=128,
        heldout_fraction=0.1,
        seed=0,
        progress=False,
        b_dec_init_tokens=2000,
    )
    base.update(kw)
    return TrainConfig(**base)


def test_b_dec_mean_from_a_sample_across_shards_is_near_the_global_mean(tmp_path):
    x = _drifting_rows()
    store = write_store(tmp_path / "store", x, shard_rows=4096)
    n_train = 36_000  # the last 10 % are held out
    mu = x[:n_train].double().mean(0)
    prefix = x[:2000].double().mean(0)
    # the prefix mean follows the first documents (golden, direct): it misses by far more than the tolerance
    assert (prefix - mu).norm() > 0.5 * mu.norm()
    result = train_sae(_cfg(), store)
    b_dec_init = result.activation_mean
    assert (b_dec_init - mu).norm() <= 0.05 * mu.norm()
    rows = result.provenance["b_dec_init_rows"]
    assert rows["n_rows"] == 2000 and rows["of_rows"] == n_train and "sample" in rows["method"]
    # b_dec starts at that mean (b_dec_init = "mean", before any step moves it much)
    assert (result.sae.b_dec.detach().double() - b_dec_init).norm() < 0.05 * mu.norm()


def test_b_dec_exact_mean_when_the_sample_covers_the_training_rows(tmp_path):
    x = _drifting_rows(n=6000)
    store = write_store(tmp_path / "store", x, shard_rows=1000)
    result = train_sae(_cfg(b_dec_init_tokens=100_000), store)
    assert torch.allclose(result.activation_mean, x[:5400].double().mean(0), atol=1e-6)
    assert result.provenance["b_dec_init_rows"] == {
        "method": "exact mean over all training rows across all 6 shard(s)",
        "n_rows": 5400,
    }


def test_b_dec_sample_from_a_tensor_is_not_its_prefix():
    x = _drifting_rows()
    result = train_sae(_cfg(), x)
    mu = x[:36_000].double().mean(0)
    assert (result.activation_mean - mu).norm() <= 0.05 * mu.norm()
