"""ActivationStore / StoreWriter: round trip, shuffling, integrity, refusals, crash-resume (no model)."""

import hashlib
import json
import multiprocessing as mp
from pathlib import Path

import numpy as np
import pytest
import torch

import saegeo.io
from saegeo.activations.store import ActivationStore, StoreWriter, write_store
from saegeo.errors import BadInputError, StoreError

D = 6


def rows(n, seed=0):
    return torch.randn(n, D, generator=torch.Generator().manual_seed(seed))


def file_hashes(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_round_trip_values_dtypes_order(tmp_path, dtype):
    x = rows(1000)
    ids = torch.arange(1000) * 7
    with StoreWriter(tmp_path / "s", d=D, hook="h", model="m", dtype=dtype, shard_rows=300) as w:
        for lo in range(0, 1000, 130):  # batches that straddle shard boundaries
            w.append(x[lo : lo + 130], token_ids=ids[lo : lo + 130])
    s = ActivationStore(tmp_path / "s")
    expected = x.to(getattr(torch, dtype)).float()
    assert [sh.rows for sh in s.shards] == [300, 300, 300, 100]
    assert (s.n_tokens, s.d, s.hook, s.model, s.dtype) == (1000, D, "h", "m", dtype)
    got = torch.cat([s.read_shard(i) for i in range(len(s.shards))])
    assert got.dtype == torch.float32 and torch.equal(got, expected)
    assert torch.equal(torch.cat([s.read_token_ids(i) for i in range(4)]), ids)
    assert torch.equal(torch.cat(list(s.iter_batches(128))), expected)
    assert [b.shape[0] for b in s.iter_batches(128)] == [128] * 7 + [104]
    assert [b.shape[0] for b in s.iter_batches(128, drop_last=True)] == [128] * 7
    assert torch.equal(s.read_rows(250, 710), expected[250:710])
    assert s.verify() == []


def test_shuffle_is_a_seeded_permutation(tmp_path):
    x = torch.arange(2000 * D, dtype=torch.float32).reshape(2000, D)  # row id recoverable from column 0
    s = write_store(tmp_path / "s", x, shard_rows=256)

    def order(**kw):
        return torch.cat(list(s.iter_batches(100, **kw)))[:, 0].long() // D

    a, b, c = order(shuffle_buffer=500, seed=1), order(shuffle_buffer=500, seed=1), order(shuffle_buffer=500, seed=2)
    assert torch.equal(a.sort().values, torch.arange(2000))  # every row exactly once
    assert torch.equal(a, b) and not torch.equal(a, c)
    # mixed across shards: the first batch draws from more than one shard
    assert len(set((a[:100] // 256).tolist())) > 1
    # shard_indices restricts to those shards (e.g. one rank's slice)
    sub = torch.cat(list(s.iter_batches(64, shard_indices=[1, 3])))[:, 0].long() // D
    assert torch.equal(sub, torch.cat([torch.arange(256, 512), torch.arange(768, 1024)]))


def test_verify_names_corrupt_truncated_missing_shards(tmp_path):
    s = write_store(tmp_path / "s", rows(1000), shard_rows=200)
    assert s.verify() == []
    f1 = tmp_path / "s" / "shard_00001.safetensors"
    data = bytearray(f1.read_bytes())
    data[-5] ^= 0x01  # flip one bit in the tensor payload
    f1.write_bytes(bytes(data))
    f3 = tmp_path / "s" / "shard_00003.safetensors"
    f3.write_bytes(f3.read_bytes()[:-100])
    (tmp_path / "s" / "shard_00004.safetensors").unlink()
    problems = ActivationStore(tmp_path / "s").verify()
    assert len(problems) == 3
    assert "shard 1 (shard_00001.safetensors)" in problems[0] and "checksum" in problems[0]
    assert "shard 3 (shard_00003.safetensors)" in problems[1] and "truncated" in problems[1]
    assert "shard 4 (shard_00004.safetensors)" in problems[2] and "missing" in problems[2]
    with pytest.raises(StoreError, match=r"shard 3 \(shard_00003.safetensors\) is truncated"):
        s.read_shard(3)
    from saegeo.cli import main

    assert main(["store", "verify", str(tmp_path / "s")]) == 1
    # a damaged store cannot be resumed
    with pytest.raises(StoreError, match="damaged"):
        StoreWriter(tmp_path / "s", d=D, hook="synthetic", model="none", shard_rows=200, mode="resume")


def test_mismatched_append_and_bad_input_refused(tmp_path):
    write_store(tmp_path / "s", rows(100), hook="h", model="m", shard_rows=64)
    base = dict(d=D, hook="h", model="m", shard_rows=64, mode="resume")
    for key, value in [("d", D + 1), ("hook", "other"), ("model", "x"), ("dtype", "float16"), ("shard_rows", 32)]:
        with pytest.raises(StoreError, match=f"refusing to append.*{key}="):
            StoreWriter(tmp_path / "s", **{**base, key: value})
    with pytest.raises(StoreError, match="refusing to append.*corpus"):
        StoreWriter(tmp_path / "s", **base, corpus={"source": "other"})
    with pytest.raises(StoreError, match="already exists"):
        StoreWriter(tmp_path / "s", d=D)
    with StoreWriter(tmp_path / "t", d=D) as w:
        with pytest.raises(BadInputError, match=r"expected \(n, 6\)"):
            w.append(torch.zeros(3, D + 1))
        w.append(torch.zeros(3, D), token_ids=torch.arange(3))
        with pytest.raises(BadInputError, match="token_ids"):
            w.append(torch.zeros(3, D))
    # nothing lost by the refusals: the original store is intact
    assert ActivationStore(tmp_path / "s").verify() == []
    assert ActivationStore(tmp_path / "s").n_tokens == 100


def test_open_errors_are_clear(tmp_path):
    with pytest.raises(StoreError, match="directory missing"):
        ActivationStore(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(StoreError, match="manifest.json missing"):
        ActivationStore(tmp_path / "empty")
    write_store(tmp_path / "s", rows(10))
    (tmp_path / "s" / "manifest.json").write_text("{not json")
    with pytest.raises(StoreError, match="corrupt manifest"):
        ActivationStore(tmp_path / "s")


def test_exception_keeps_whole_shards_then_resume_is_identical(tmp_path):
    x = rows(1000, seed=3)
    write_store(tmp_path / "ref", x, shard_rows=128)
    with pytest.raises(RuntimeError, match="^killed$"):  # the test's own exception, not one from the writer
        with StoreWriter(tmp_path / "s", d=D, hook="synthetic", model="none", shard_rows=128) as w:
            w.append(x[:300])
            raise RuntimeError("killed")
    with pytest.raises(StoreError, match="incomplete"):
        ActivationStore(tmp_path / "s")
    partial = ActivationStore(tmp_path / "s", allow_incomplete=True)
    assert partial.n_tokens == 256  # the two full shards; the 44 buffered rows are regenerated on resume
    with StoreWriter(tmp_path / "s", d=D, hook="synthetic", model="none", shard_rows=128, mode="resume") as w:
        w.append(x[w.n_tokens :])
    assert file_hashes(tmp_path / "s") == file_hashes(tmp_path / "ref")
    # appending to a complete store continues it exactly (the short last shard is refilled)
    write_store(tmp_path / "ref2", torch.cat([x, x[:77]]), shard_rows=128)
    with StoreWriter(tmp_path / "s", d=D, hook="synthetic", model="none", shard_rows=128, mode="resume") as w:
        assert w.n_tokens == 1000
        w.append(x[:77])
    assert file_hashes(tmp_path / "s") == file_hashes(tmp_path / "ref2")


def _produce(path: str, crash_at: str | None) -> None:
    """Writer process: deterministic rows, resumes from whatever the store holds."""
    import os

    if crash_at:
        os.environ["SAEGEO_CRASH_AT"] = crash_at
    saegeo.io._CRASH_COUNTS.clear()
    x = rows(1000, seed=5)
    with StoreWriter(path, d=D, hook="synthetic", model="none", shard_rows=128, mode="resume") as w:
        for lo in range(w.n_tokens, 1000, 50):
            w.append(x[lo : lo + 50])
    os._exit(0)


@pytest.mark.parametrize("crash_at", ["before_shard:2", "mid_shard:3", "after_shard:2", "after_manifest:4"])
def test_killed_writer_resumes_identically(tmp_path, crash_at):
    ctx = mp.get_context("fork")
    ref = tmp_path / "ref"
    p = ctx.Process(target=_produce, args=(str(ref), None))
    p.start()
    p.join()
    assert p.exitcode == 0
    victim = tmp_path / "victim"
    p = ctx.Process(target=_produce, args=(str(victim), crash_at))
    p.start()
    p.join()
    assert p.exitcode == 137  # really killed (os._exit: no cleanup ran)
    manifest = json.loads((victim / "manifest.json").read_text())
    assert manifest["complete"] is False
    if crash_at.startswith("mid_shard"):
        assert any(f.name.endswith(".tmp") for f in victim.iterdir())  # a half-written shard was left behind
    p = ctx.Process(target=_produce, args=(str(victim), None))
    p.start()
    p.join()
    assert p.exitcode == 0
    assert file_hashes(victim) == file_hashes(ref)
    np.testing.assert_array_equal(
        torch.cat(list(ActivationStore(victim).iter_batches(1000))).numpy(), rows(1000, seed=5).numpy()
    )


def test_batches_with_metadata_cut_and_shuffle_ids_and_positions_with_their_rows(tmp_path):
    """metadata=True yields (rows, token_ids, positions) in the same batches as the rows alone, in store order
    and shuffled: each row keeps its own id and position (row r holds r in every column here)."""
    n = 1000
    x = torch.arange(n, dtype=torch.float32)[:, None].repeat(1, 3)
    with StoreWriter(tmp_path / "s", d=3, shard_rows=128) as w:
        w.append(x, token_ids=torch.arange(n), positions=torch.arange(n) % 64)
    s = ActivationStore(tmp_path / "s")
    assert s.columns == ("positions", "token_ids")
    for kw in ({}, {"shuffle_buffer": 300, "seed": 1}, {"stop_row": 700, "shard_indices": [1, 2, 5, 6]}):
        plain = list(s.iter_batches(100, **kw))
        with_meta = list(s.iter_batches(100, metadata=True, **kw))
        assert [b.shape[0] for b in plain] == [b[0].shape[0] for b in with_meta]
        for rows, (rows_m, ids, pos) in zip(plain, with_meta):
            assert torch.equal(rows, rows_m)
            assert torch.equal(ids, rows[:, 0].long()) and torch.equal(pos, rows[:, 0].long() % 64)
