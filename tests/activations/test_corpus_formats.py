"""Text in the forms people keep it: .json arrays, parquet, `datasets` folders and the offline datasets cache,
pre-tokenised token arrays; and the corpus validated before any model loads.

Each source is checked against the same records written as .jsonl (the long-standing reader), or, for token
arrays, against the arrays themselves cut by hand."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from saegeo.activations.corpus import CorpusSpec, corpus_identity, iter_windows, open_corpus
from saegeo.activations.models import _load_tokenizer, _quiet_transformers, minilm_path
from saegeo.errors import BadInputError

RECORDS = [
    {"text": "alpha beta gamma " * 12, "id": 1},
    {"text": "one two three", "id": 2},
    {"text": "delta epsilon " * 9, "id": 3},
]


@pytest.fixture(scope="module")
def tok():
    _quiet_transformers()
    return _load_tokenizer(minilm_path())


def ids_of(spec, tok):
    return [(w.input_ids, w.store, w.doc) for w in iter_windows(spec, tok)]


@pytest.fixture
def jsonl(tmp_path):
    path = tmp_path / "ref.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in RECORDS) + "\n")
    return path


def test_json_array_of_records_tokenises_its_records(tmp_path, tok, jsonl):
    (tmp_path / "a.json").write_text(json.dumps(RECORDS))
    got = ids_of(CorpusSpec(source=str(tmp_path / "a.json"), context=16), tok)
    assert got == ids_of(CorpusSpec(source=str(jsonl), context=16), tok)
    assert len({doc for _, _, doc in got}) == 3  # three documents, not one JSON text
    (tmp_path / "s.json").write_text(json.dumps([r["text"] for r in RECORDS]))  # an array of strings
    assert ids_of(CorpusSpec(source=str(tmp_path / "s.json"), context=16), tok) == got
    (tmp_path / "b.json").write_text(json.dumps({"rows": RECORDS}))
    with pytest.raises(BadInputError, match=r"b\.json: .*array"):
        open_corpus(CorpusSpec(source=str(tmp_path / "b.json")))


def test_parquet_text_column(tmp_path, tok, jsonl):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(
        pa.table({"body": [r["text"] for r in RECORDS], "id": [1, 2, 3]}), tmp_path / "a.parquet", row_group_size=2
    )
    got = ids_of(CorpusSpec(source=str(tmp_path / "a.parquet"), context=16, text_field="body"), tok)
    assert got == ids_of(CorpusSpec(source=str(jsonl), context=16), tok)


def test_datasets_folder_saved_with_save_to_disk(tmp_path, tok, jsonl):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list(RECORDS)
    ds.save_to_disk(str(tmp_path / "saved"))
    want = ids_of(CorpusSpec(source=str(jsonl), context=16), tok)
    assert ids_of(CorpusSpec(source=str(tmp_path / "saved"), context=16), tok) == want
    datasets.DatasetDict({"train": ds, "test": ds.select([0])}).save_to_disk(str(tmp_path / "dd"))
    assert ids_of(CorpusSpec(source=str(tmp_path / "dd"), context=16), tok) == want  # the train split
    test_split = ids_of(CorpusSpec(source=f"{tmp_path / 'dd'}:test", context=16), tok)
    assert test_split == [w for w in want if w[2] == 0]
    ident = corpus_identity(CorpusSpec(source=str(tmp_path / "saved")), tok)
    assert ident["files"][0]["fingerprint"] == datasets.load_from_disk(str(tmp_path / "saved"))._fingerprint


def _offline_datasets_cache(root, name, records):
    """An HF datasets cache as `load_dataset(name)` leaves it (namespace___name/default/0.0.0/<hash>/), built
    in a child process from a local parquet file, offline."""
    code = f"""
import os, shutil, datasets, pyarrow as pa, pyarrow.parquet as pq
pq.write_table(pa.table({{"text": {[r["text"] for r in records]!r}}}), {str(root / "src.parquet")!r})
datasets.load_dataset("parquet", data_files={{"train": {str(root / "src.parquet")!r}}})
cache = datasets.config.HF_DATASETS_CACHE
ns, short = {name!r}.split("/")
target = os.path.join(cache, ns + "___" + short)
shutil.copytree(os.path.join(cache, "parquet"), target)
(config,) = os.listdir(target)
os.rename(os.path.join(target, config), os.path.join(target, "default"))
for dirpath, _, files in os.walk(target):
    for f in files:
        if f.startswith("parquet-"):
            os.rename(os.path.join(dirpath, f), os.path.join(dirpath, short + f[len("parquet"):]))
"""
    env = {
        "HF_HOME": str(root / "hf"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "PATH": "/usr/bin:/bin",
        "TQDM_DISABLE": "1",
    }
    subprocess.run([sys.executable, "-c", code], check=True, env=env, capture_output=True, timeout=300)
    return root / "hf" / "datasets"


def test_datasets_cache_by_name_offline(tmp_path, tok, jsonl, monkeypatch):
    datasets = pytest.importorskip("datasets")
    cache = _offline_datasets_cache(tmp_path, "someone/tiny-corpus", RECORDS)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    got = ids_of(CorpusSpec(source="someone/tiny-corpus", context=16), tok)
    assert got == ids_of(CorpusSpec(source=str(jsonl), context=16), tok)
    ident = corpus_identity(CorpusSpec(source="someone/tiny-corpus"), tok)
    assert ident["files"][0]["dataset"] == "someone/tiny-corpus" and ident["files"][0]["split"] == "train"
    with pytest.raises(BadInputError, match=r"someone/absent.*not .*cache"):
        open_corpus(CorpusSpec(source="someone/absent"))


class NoTokenizing:
    """A tokenizer that may be asked its size and special ids, but must never tokenize."""

    def __init__(self, tok):
        self.tok = tok
        self.all_special_ids = tok.all_special_ids
        self.pad_token_id = tok.pad_token_id

    def __len__(self):
        return len(self.tok)

    def __call__(self, *a, **k):
        raise AssertionError("pre-tokenised text must not be tokenized")


def test_pretokenised_arrays_used_as_given(tmp_path, tok):
    from safetensors.numpy import save_file

    rows = np.random.default_rng(0).integers(1000, 2000, size=(3, 20))
    rows[:, 0] = 101  # [CLS] at the start of each row, as a pre-tokenised dataset holds it
    np.save(tmp_path / "t.npy", rows)
    no_tok = NoTokenizing(tok)
    spec = CorpusSpec(source=str(tmp_path / "t.npy"), context=8)
    got = list(iter_windows(spec, no_tok))
    # each row is a document cut into windows of `context` ids, nothing added, nothing dropped
    want = [list(r[lo : lo + 8]) for r in rows for lo in range(0, 20, 8)]
    assert [w.input_ids for w in got] == want and [w.doc for w in got] == [d for d in range(3) for _ in range(3)]
    assert all(all(w.store) for w in got)
    excl = list(iter_windows(CorpusSpec(source=str(tmp_path / "t.npy"), context=8, exclude_special=True), no_tok))
    assert [w.store for w in excl][0] == [False] + [True] * 7 and sum(w.n_stored for w in excl) == 60 - 3
    save_file({"input_ids": rows.astype(np.int64)}, str(tmp_path / "t.safetensors"))
    assert [
        w.input_ids for w in iter_windows(CorpusSpec(source=str(tmp_path / "t.safetensors"), context=8), no_tok)
    ] == want
    np.save(tmp_path / "flat.npy", rows.reshape(-1))  # one stream of ids
    flat = [w.input_ids for w in iter_windows(CorpusSpec(source=str(tmp_path / "flat.npy"), context=8), no_tok)]
    assert flat == [list(rows.reshape(-1)[lo : lo + 8]) for lo in range(0, 60, 8)]
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"input_ids": [list(map(int, r)) for r in rows]}), tmp_path / "t.parquet")
    assert [
        w.input_ids for w in iter_windows(CorpusSpec(source=str(tmp_path / "t.parquet"), context=8), no_tok)
    ] == want
    np.save(tmp_path / "f.npy", rows.astype(np.float32))
    with pytest.raises(BadInputError, match=r"f\.npy: .*integer token ids"):
        open_corpus(CorpusSpec(source=str(tmp_path / "f.npy")))
    big = rows.copy()
    big[1, 5] = len(tok) + 7
    np.save(tmp_path / "big.npy", big)
    with pytest.raises(BadInputError, match=r"big\.npy: row 1: token id .* vocabulary"):
        list(iter_windows(CorpusSpec(source=str(tmp_path / "big.npy"), context=8), no_tok))


def test_bad_field_is_named_before_reading_on(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"body": "x"}\n')
    with pytest.raises(BadInputError, match=r"a\.jsonl:1: no string field 'text'.*body.*--text-field"):
        open_corpus(CorpusSpec(source=str(tmp_path / "a.jsonl")))
    (tmp_path / "a.json").write_text(json.dumps([{"text": "ok"}, {"body": "x"}]))
    with pytest.raises(BadInputError, match=r"a\.json: record 2: no string field 'text'"):
        open_corpus(CorpusSpec(source=str(tmp_path / "a.json")))
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "a.parquet")
    with pytest.raises(BadInputError, match=r"a\.parquet: no column 'text' \(columns: body\).*--text-field"):
        open_corpus(CorpusSpec(source=str(tmp_path / "a.parquet")))


def test_cache_and_eval_refuse_a_bad_field_before_the_model_loads(tmp_path, monkeypatch):
    import saegeo.activations.cache as cache
    import saegeo.sae.evaluate as splice
    from saegeo.activations.cache import CacheConfig, cache_activations
    from saegeo.sae.evaluate import EvalConfig, splice_eval_many
    from saegeo.sae.model import SAE, SAEConfig

    (tmp_path / "a.jsonl").write_text('{"body": "x"}\n')
    monkeypatch.setattr(cache, "load_model", lambda *a, **k: pytest.fail("the model loaded first"))
    monkeypatch.setattr(splice, "load_model", lambda *a, **k: pytest.fail("the model loaded first"))
    with pytest.raises(BadInputError, match=r"a\.jsonl:1: no string field 'text'"):
        cache_activations(CacheConfig(corpus=str(tmp_path / "a.jsonl"), out=str(tmp_path / "out"), progress=False))
    sae = SAE(SAEConfig(d_in=8, d_sae=16, activation="relu"))
    with pytest.raises(BadInputError, match=r"a\.jsonl:1: no string field 'text'"):
        splice_eval_many(EvalConfig(corpus=str(tmp_path / "a.jsonl"), progress=False), {"s": sae})
    assert not (tmp_path / "out").exists()


def test_cli_bad_field_one_line_exit_2(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps([{"body": "x"}]))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "saegeo.cli",
            "cache",
            "--model",
            "smollm2",
            "--corpus",
            str(tmp_path / "a.json"),
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "a.json: record 1: no string field 'text'" in r.stderr


def test_cached_pretokenised_store_holds_the_given_ids(tmp_path):
    from saegeo.activations.cache import CacheConfig, cache_activations
    from saegeo.activations.store import ActivationStore

    rows = np.random.default_rng(1).integers(1000, 2000, size=(2, 12))
    np.save(tmp_path / "t.npy", rows)
    cfg = CacheConfig(
        model="minilm",
        hooks=("blocks.0.hook_resid_post",),
        corpus=str(tmp_path / "t.npy"),
        context=12,
        out=str(tmp_path / "acts"),
        progress=False,
    )
    cache_activations(cfg)
    store = ActivationStore(tmp_path / "acts" / "blocks.0.hook_resid_post")
    got = torch.cat([store.read_token_ids(i) for i in range(len(store.shards))])
    assert got.tolist() == rows.reshape(-1).tolist()
    assert store.corpus["files"][0]["path"].endswith("t.npy")
