"""Corpus sources -> token windows, checked against the tokenizer applied directly."""

import json

import pytest

from saegeo.activations.corpus import CorpusSpec, corpus_identity, count_tokens, iter_windows, special_template
from saegeo.activations.models import _load_tokenizer, _quiet_transformers, minilm_path
from saegeo.errors import BadInputError

CLS, SEP = 101, 102


@pytest.fixture(scope="module")
def tok():
    _quiet_transformers()
    return _load_tokenizer(minilm_path())


def test_windows_reassemble_each_document(tmp_path, tok):
    docs = ["alpha beta gamma " * 40, "one two three", "delta epsilon " * 25]
    (tmp_path / "a.txt").write_text(docs[0])
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps({"body": d}) for d in docs[1:]) + "\n")
    spec = CorpusSpec(source=f"{tmp_path / 'a.txt'},{tmp_path / 'b.jsonl'}", context=16, text_field="body")
    windows = list(iter_windows(spec, tok))
    assert special_template(tok, "encoder") == ([CLS], [SEP])
    for doc_index, text in enumerate(docs):
        mine = [w for w in windows if w.doc == doc_index]
        # each window is [CLS] body [SEP], at most `context` long, never crossing documents
        assert all(w.input_ids[0] == CLS and w.input_ids[-1] == SEP and len(w.input_ids) <= 16 for w in mine)
        assert all(len(w.input_ids) == 16 for w in mine[:-1])
        body = [t for w in mine for t in w.input_ids[1:-1]]
        assert body == tok(text, add_special_tokens=False)["input_ids"]
    assert count_tokens(spec, tok) == sum(len(w.input_ids) for w in windows)
    excl = CorpusSpec(**{**spec.__dict__, "exclude_special": True})
    assert count_tokens(excl, tok) == count_tokens(spec, tok) - 2 * len(windows)
    assert all(not s for w in iter_windows(excl, tok) for s, t in zip(w.store, w.input_ids) if t in (CLS, SEP))


def test_dirs_and_globs_sorted(tmp_path, tok):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "z.txt").write_text("zeta")
    (tmp_path / "d" / "sub" / "a.md").write_text("alpha")
    (tmp_path / "d" / "skip.bin").write_bytes(b"\x00\x01")
    by_dir = [w.input_ids for w in iter_windows(CorpusSpec(source=str(tmp_path / "d"), context=8), tok)]
    assert by_dir == [[CLS] + tok(t, add_special_tokens=False)["input_ids"] + [SEP] for t in ("alpha", "zeta")]
    by_glob = [
        w.input_ids for w in iter_windows(CorpusSpec(source=f"{tmp_path}/d/**/*.md,{tmp_path}/d/*.txt", context=8), tok)
    ]
    assert by_glob == by_dir


def test_default_corpus_and_identity(tok):
    spec = CorpusSpec()
    first = next(iter(iter_windows(spec, tok)))
    from pydoc_data.topics import topics

    text = topics[sorted(topics)[0]]
    assert first.input_ids[1:-1] == tok(text, add_special_tokens=False)["input_ids"][:126]
    ident = corpus_identity(spec, tok)
    assert ident["source"].startswith("default (pydoc_data.topics") and len(ident["sha256"]) == 64
    assert corpus_identity(CorpusSpec(context=64), tok) != ident


def test_bad_sources_named(tmp_path, tok):
    with pytest.raises(BadInputError, match="not 'default', a file, a directory or a glob"):
        list(iter_windows(CorpusSpec(source=str(tmp_path / "missing.txt")), tok))
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"txt": "no"}\n')
    with pytest.raises(BadInputError, match=r"bad.jsonl:2: no string field 'text'.*--text-field"):
        list(iter_windows(CorpusSpec(source=str(tmp_path / "bad.jsonl")), tok))
    (tmp_path / "broken.jsonl").write_text('{"text": "ok"}\n{oops\n')
    with pytest.raises(BadInputError, match="broken.jsonl:2: not valid JSON"):
        list(iter_windows(CorpusSpec(source=str(tmp_path / "broken.jsonl")), tok))
    with pytest.raises(BadInputError, match="no room"):
        list(iter_windows(CorpusSpec(context=2), tok))


def test_big_text_files_are_read_in_blocks_without_changing_the_windows(tmp_path, tok, monkeypatch):
    import saegeo.activations.corpus as corpus

    lines = [f"line {i} holds a few plain words.\n" for i in range(400)]
    (tmp_path / "big.txt").write_text("".join(lines))
    spec = CorpusSpec(source=str(tmp_path / "big.txt"), context=16)
    monkeypatch.setattr(corpus, "BLOCK_CHARS", 300)  # ~40 blocks; lines end in "\n", so no word is split
    body = [t for w in iter_windows(spec, tok) for t in w.input_ids[1:-1]]
    assert body == tok("".join(lines), add_special_tokens=False)["input_ids"]
    (tmp_path / "bad.txt").write_bytes(b"fine\n" * 100 + b"\xff broken\n")
    with pytest.raises(BadInputError, match=r"bad\.txt: not UTF-8"):
        list(iter_windows(CorpusSpec(source=str(tmp_path / "bad.txt"), context=16), tok))


# ---------------------------------------------------------------- long lines
def _recording(tok, seen: list):
    """The tokenizer, recording the length of every text it is given."""

    def call(text, **kw):
        seen.append(len(text))
        return tok(text, **kw)

    class Recording:
        def __getattr__(self, name):
            return getattr(tok, name)

        def __call__(self, text, **kw):
            return call(text, **kw)

        def __len__(self):
            return len(tok)

    return Recording()


@pytest.mark.parametrize("kind", ["txt", "jsonl"])
def test_one_long_line_is_tokenized_in_pieces_giving_the_same_windows(tmp_path, tok, monkeypatch, kind):
    import saegeo.activations.corpus as corpus

    text = " ".join(f"word{i % 97} and  more\ttext" for i in range(300))  # one line, runs of spaces, tabs
    if kind == "txt":
        (tmp_path / "long.txt").write_text(text + "\nshort second line\n")
        whole = text + "\nshort second line\n"
    else:
        (tmp_path / "long.jsonl").write_text(json.dumps({"text": text}) + "\n")
        whole = text
    monkeypatch.setattr(corpus, "PIECE_CHARS", 200)
    seen: list[int] = []
    spec = CorpusSpec(source=str(tmp_path / f"long.{kind}"), context=16)
    body = [t for w in iter_windows(spec, _recording(tok, seen)) for t in w.input_ids[1:-1]]
    assert body == tok(whole, add_special_tokens=False)["input_ids"]
    assert max(seen) <= 2 * 200 and len(seen) > len(text) // 200  # pieces, never the whole line


def test_max_tokens_bounds_the_work_whatever_the_line_length(tmp_path, tok):
    """A 4 MB line: the first 4,096 tokens are made from the first pieces only (the whole line was tokenized
    before: 10 MB took 277 s and 2.1 GB)."""
    import saegeo.activations.corpus as corpus

    (tmp_path / "one.txt").write_text("plain words in one very long line " * 120_000)  # 4.1 MB, no newline
    seen: list[int] = []
    spec = CorpusSpec(source=str(tmp_path / "one.txt"), context=128)
    assert count_tokens(spec, _recording(tok, seen), limit=4096) == 4096
    assert max(seen) <= 2 * corpus.PIECE_CHARS and sum(seen) < 8 * corpus.PIECE_CHARS


def test_a_long_run_without_whitespace_is_cut_where_it_stands(tmp_path, tok, monkeypatch):
    import saegeo.activations.corpus as corpus

    monkeypatch.setattr(corpus, "PIECE_CHARS", 100)
    (tmp_path / "run.txt").write_text("x" * 1000)
    seen: list[int] = []
    windows = list(iter_windows(CorpusSpec(source=str(tmp_path / "run.txt"), context=16), _recording(tok, seen)))
    assert windows and max(seen) <= 200
