"""MovieLens 100K loader on small synthetic files in both layouts; split; ranking metrics.

Never touches the network: downloads are disabled or replaced.
"""

import zipfile

import numpy as np
import pytest

from losszoo.datasets import load_100k, movielens

RATINGS = [
    (1, 10, 4, 881250949),
    (1, 20, 3, 881250950),
    (2, 10, 5, 881250951),
    (3, 30, 1, 881250952),
    (2, 30, 2, 881250953),
]
ITEMS = [
    (10, "Toy Story (1995)", ("Animation", "Children's", "Comedy")),
    (20, "GoldenEye (1995)", ("Action", "Thriller")),
    (30, "Café (1996)", ("Drama",)),
]


def write_grouplens(folder):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "u.data").write_text("".join(f"{u}\t{i}\t{r}\t{t}\n" for u, i, r, t in RATINGS))
    lines = []
    for item, title, genres in ITEMS:
        flags = "|".join("1" if g in genres else "0" for g in movielens.GENRES)
        lines.append(f"{item}|{title}|01-Jan-1995||http://x|{flags}\n")
    (folder / "u.item").write_bytes("".join(lines).encode("latin-1"))


def write_recbole(folder):
    folder.mkdir(parents=True, exist_ok=True)
    inter = "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
    inter += "".join(f"{u}\t{i}\t{r}\t{t}\n" for u, i, r, t in RATINGS)
    (folder / "ml-100k.inter").write_text(inter)
    item = "item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq\n"
    item += "".join(f"{i}\t{t}\t1995\t{' '.join(g)}\n" for i, t, g in ITEMS)
    (folder / "ml-100k.item").write_text(item, encoding="utf-8")


def check(data):
    np.testing.assert_array_equal(data.user, [r[0] for r in RATINGS])
    np.testing.assert_array_equal(data.item, [r[1] for r in RATINGS])
    np.testing.assert_array_equal(data.rating, [r[2] for r in RATINGS])
    np.testing.assert_array_equal(data.timestamp, [r[3] for r in RATINGS])
    np.testing.assert_array_equal(data.item_ids, [10, 20, 30])
    assert [tuple(g) for g in data.genres] == [g for _, _, g in ITEMS]
    assert data.titles[0].startswith("Toy Story") and data.titles[2].startswith("Caf")
    u, i, nu, ni = data.indexed()
    assert (nu, ni) == (3, 3)
    np.testing.assert_array_equal(u, [0, 0, 1, 2, 1])
    np.testing.assert_array_equal(i, [0, 1, 0, 2, 2])


_REAL_RECBOLE = movielens._from_recbole_wheel


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(movielens.CACHE_ENV, str(tmp_path / "cache"))

    def no_network(*args, **kwargs):
        raise AssertionError("the tests must not touch the network")

    monkeypatch.setattr(movielens, "_from_grouplens", no_network)
    monkeypatch.setattr(movielens, "_from_recbole_wheel", no_network)


@pytest.mark.parametrize("writer", [write_grouplens, write_recbole])
def test_reads_both_layouts(tmp_path, writer):
    writer(tmp_path / "data")
    check(load_100k(tmp_path / "data", download=False))
    # also when the files sit in an ml-100k subfolder
    writer(tmp_path / "outer" / "ml-100k")
    check(load_100k(tmp_path / "outer", download=False))


def test_reads_the_grouplens_zip(tmp_path):
    write_grouplens(tmp_path / "raw")
    with zipfile.ZipFile(tmp_path / "ml-100k.zip", "w") as archive:
        for name in ("u.data", "u.item"):
            archive.write(tmp_path / "raw" / name, f"ml-100k/{name}")
    check(load_100k(tmp_path, download=False))


def test_cache_is_used_and_every_failure_is_reported(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError) as err:
        load_100k(download=False)
    text = str(err.value)
    assert "cache" in text and "download=False" in text and "data_dir" in text
    write_recbole(movielens.cache_dir())
    check(load_100k(download=False))


def test_download_sources_in_order_and_aggregated_errors(tmp_path, monkeypatch):
    calls = []

    def grouplens(target):
        calls.append("grouplens")
        raise OSError("unreachable")

    def recbole(target):
        calls.append("recbole")
        write_recbole(target)

    monkeypatch.setattr(movielens, "_from_grouplens", grouplens)
    monkeypatch.setattr(movielens, "_from_recbole_wheel", recbole)
    check(load_100k())
    assert calls == ["grouplens", "recbole"]

    def broken(target):
        raise RuntimeError("pip download failed")

    monkeypatch.setenv(movielens.CACHE_ENV, str(tmp_path / "other"))
    monkeypatch.setattr(movielens, "_from_recbole_wheel", broken)
    with pytest.raises(FileNotFoundError) as err:
        load_100k()
    text = str(err.value)
    assert "GroupLens" in text and "unreachable" in text
    assert "recbole==1.2.1" in text and "pip download failed" in text


def test_recbole_wheel_extraction_takes_only_the_data_files(tmp_path, monkeypatch):
    wheel_dir = tmp_path / "wheel"
    write_recbole(wheel_dir)
    wheel = tmp_path / "recbole-1.2.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name in ("ml-100k.inter", "ml-100k.item"):
            archive.write(wheel_dir / name, movielens.RECBOLE_PREFIX + name)
        archive.writestr("recbole/__init__.py", "raise ImportError")
        archive.writestr("recbole/dataset_example/ml-1m/ml-1m.inter", "x")
    target = tmp_path / "out"
    with zipfile.ZipFile(wheel) as archive:
        movielens._extract_members(
            archive,
            movielens.RECBOLE_PREFIX,
            target,
            ("ml-100k.inter", "ml-100k.item", "ml-100k.user"),
        )
    assert sorted(p.name for p in target.iterdir()) == ["ml-100k.inter", "ml-100k.item"]
    check(movielens.read_folder(target))


def test_split_is_a_seeded_partition_of_pairs():
    rng = np.random.default_rng(0)
    n = 2000
    data = movielens.MovieLens100K(
        user=rng.integers(1, 60, n),
        item=rng.integers(1, 200, n),
        rating=np.ones(n, np.float32),
        timestamp=np.zeros(n, np.int64),
        item_ids=np.arange(1, 200),
        titles=[""] * 199,
        genres=[()] * 199,
    )
    s = movielens.split_pairs(data, seed=3)
    parts = [s.train, s.validation, s.test]
    total = sum(len(p) for p in parts)
    pairs = {tuple(p) for part in parts for p in part}
    assert len(pairs) == total  # disjoint, no duplicate pairs
    u, i, _, _ = data.indexed()
    assert pairs == set(zip(u.tolist(), i.tolist()))
    np.testing.assert_allclose([len(p) / total for p in parts], [0.8, 0.1, 0.1], atol=1e-3)
    again = movielens.split_pairs(data, seed=3)
    np.testing.assert_array_equal(again.test, s.test)
    assert not np.array_equal(movielens.split_pairs(data, seed=4).test, s.test)


def brute_force_metrics(scores, heldout, exclude, k_ap=10, k_r=100):
    aps, accs, recalls = [], [], []
    for s, h, e in zip(scores, heldout, exclude):
        if not h.any():
            continue
        items = [j for j in np.argsort(-s, kind="stable") if not e[j]]
        rel = [1.0 if h[j] else 0.0 for j in items]
        ap = sum(rel[i] * sum(rel[: i + 1]) / (i + 1) for i in range(min(k_ap, len(rel))))
        aps.append(ap / min(k_ap, h.sum()))
        accs.append(rel[0])
        recalls.append(sum(rel[:k_r]) / h.sum())
    return np.mean(aps), np.mean(accs), np.mean(recalls)


def test_ranking_metrics_match_brute_force():
    rng = np.random.default_rng(1)
    scores = rng.normal(size=(40, 150))
    heldout = rng.random((40, 150)) < 0.05
    heldout[0] = False  # a user without held-out items is skipped
    exclude = (rng.random((40, 150)) < 0.2) & ~heldout
    got = movielens.ranking_metrics(scores, heldout, exclude, ks=(100,))
    ap, acc, rec = brute_force_metrics(scores, heldout, exclude)
    assert got["AP@10"] == pytest.approx(ap)
    assert got["Accuracy"] == pytest.approx(acc)
    assert got["R@100"] == pytest.approx(rec)
    assert got["users"] == int((heldout.sum(1) > 0).sum())
    # removing training items matters: a perfect scorer on the excluded items scores 0 without it
    top_train = np.where(exclude, 10.0, scores)
    assert movielens.ranking_metrics(top_train, heldout, exclude, ks=(100,))[
        "AP@10"
    ] == pytest.approx(ap)


# --------------------------------------------------------------------------- fail loud (issue 9)


def test_a_wrong_data_dir_raises_instead_of_loading_the_cache(tmp_path):
    write_recbole(movielens.cache_dir())  # a valid cached copy that must NOT be returned
    with pytest.raises(FileNotFoundError, match=r"`data_dir`='/typo.*does not exist"):
        load_100k(data_dir="/typo")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="`data_dir`=.*neither u.data"):
        load_100k(data_dir=empty)
    check(load_100k(download=False))  # data_dir=None still uses the cache


def test_a_corrupt_zip_names_the_file_and_the_remedy(tmp_path):
    (tmp_path / "ml-100k.zip").write_bytes(b"PK\x03\x04 truncated download")
    with pytest.raises(ValueError) as err:
        load_100k(tmp_path, download=False)
    text = str(err.value)
    assert str(tmp_path / "ml-100k.zip") in text and "`data_dir`" in text
    assert "not a valid zip" in text and "Delete it" in text
    assert not isinstance(err.value, zipfile.BadZipFile)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"data_dir": 3}, "`data_dir` must be a path"),
        ({"download": "yes"}, "`download` must be True or False"),
        ({"verbose": 1}, "`verbose` must be True or False"),
    ],
)
def test_load_arguments_are_validated(kwargs, match):
    with pytest.raises(TypeError, match=match):
        load_100k(**kwargs)


def test_split_and_mask_arguments_are_validated():
    data = movielens.MovieLens100K(
        user=np.array([1, 2, 3]),
        item=np.array([1, 2, 3]),
        rating=np.ones(3, np.float32),
        timestamp=np.zeros(3, np.int64),
        item_ids=np.array([1, 2, 3]),
        titles=[""] * 3,
        genres=[()] * 3,
    )
    for fractions in ((0.5, 0.5), (0.8, 0.1, float("nan")), (1.2, -0.1, -0.1), "abc"):
        with pytest.raises(ValueError, match="`fractions`"):
            movielens.split_pairs(data, fractions=fractions)
    for seed in (-1, 1.5, True):
        with pytest.raises(ValueError, match="`seed`"):
            movielens.split_pairs(data, seed=seed)
    with pytest.raises(ValueError, match="`pairs` must hold 0-based indices"):
        movielens.pairs_to_mask(np.array([[0, 3]]), 3, 3)
    with pytest.raises(ValueError, match=r"`pairs` must be integer .* shape \[P, 2\]"):
        movielens.pairs_to_mask(np.array([[0.0, 1.0]]), 3, 3)
    with pytest.raises(ValueError, match="`num_items` must be a positive integer"):
        movielens.pairs_to_mask(np.array([[0, 1]]), 3, 0)
    mask = movielens.pairs_to_mask(np.array([[0, 1], [2, 2]]), 3, 3)
    np.testing.assert_array_equal(mask, [[0, 1, 0], [0, 0, 0], [0, 0, 1]])


def test_ranking_metrics_with_fewer_items_than_the_cutoffs():
    rng = np.random.default_rng(2)
    scores = rng.normal(size=(12, 5))  # 5 items < ap_k = 10 and < 100
    heldout = rng.random((12, 5)) < 0.3
    exclude = (rng.random((12, 5)) < 0.2) & ~heldout
    heldout[heldout.sum(1) == 0, 0] = True
    exclude[:, 0] &= ~heldout[:, 0]
    got = movielens.ranking_metrics(scores, heldout, exclude, ks=(1, 100))
    ap, acc, rec = brute_force_metrics(scores, heldout, exclude)
    assert got["AP@10"] == pytest.approx(ap)
    assert got["Accuracy"] == pytest.approx(acc)
    assert got["R@100"] == pytest.approx(rec) and got["R@100"] == pytest.approx(1.0)
    # a perfect ranking of 5 items scores AP 1 at any cut-off
    perfect = np.where(heldout, 1.0, 0.0)
    assert movielens.ranking_metrics(perfect, heldout, ap_k=10)["AP@10"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda s, h, e: (s[:, :-1], h, e), "`heldout` must have the shape"),
        (lambda s, h, e: (np.where(h, np.nan, s), h, e), "`scores` must not hold NaN"),
        (lambda s, h, e: (np.where(h, np.inf, s), h, e), r"\+inf"),
        (lambda s, h, e: (s[0], h, e), "`scores` must be a non-empty numeric"),
        (lambda s, h, e: (s, h * 0.5, e), "`heldout` must be a bool mask"),
        (lambda s, h, e: (s, h, e | h), "overlap"),
        (lambda s, h, e: (s, np.zeros_like(h), e), "no user with a held-out item"),
    ],
)
def test_ranking_metrics_rejects_bad_inputs(change, match):
    rng = np.random.default_rng(3)
    scores = rng.normal(size=(6, 20))
    heldout = rng.random((6, 20)) < 0.2
    heldout[:, 0] = True
    exclude = (rng.random((6, 20)) < 0.2) & ~heldout
    with pytest.raises(ValueError, match=match):
        movielens.ranking_metrics(*change(scores, heldout, exclude))


@pytest.mark.parametrize("kwargs", [{"ks": (0,)}, {"ks": (10.5,)}, {"ap_k": 0}, {"ks": ()}])
def test_ranking_metrics_rejects_bad_cutoffs(kwargs):
    scores = np.arange(8.0).reshape(2, 4)
    heldout = np.eye(2, 4, dtype=bool)
    with pytest.raises(ValueError, match="`ks`|`ap_k`"):
        movielens.ranking_metrics(scores, heldout, **kwargs)


def test_ranking_metrics_minus_inf_ranks_last():
    scores = np.array([[-np.inf, 0.0, 1.0]])
    heldout = np.array([[True, False, False]])
    got = movielens.ranking_metrics(scores, heldout, ks=(1, 3), ap_k=3)
    assert got["Accuracy"] == 0.0 and got["R@3"] == 1.0
    assert got["AP@3"] == pytest.approx(1 / 3)


# --------------------------------------------------------------------------- issue 19


@pytest.mark.parametrize("writer", [write_grouplens, write_recbole])
@pytest.mark.parametrize(
    "row, column",
    [
        ((1, 10, 99, 881250949), "rating"),
        ((1, 10, -4, 881250949), "rating"),
        ((1, 10, 0, 881250949), "rating"),
        ((1, 10, 3.5, 881250949), "rating"),
        ((-1, 10, 4, 881250949), "user_id"),
        ((0, 10, 4, 881250949), "user_id"),
        ((1, -10, 4, 881250949), "item_id"),
    ],
)
def test_out_of_range_ratings_and_ids_are_rejected(tmp_path, monkeypatch, writer, row, column):
    monkeypatch.setitem(globals(), "RATINGS", [*RATINGS[:2], row, *RATINGS[2:]])
    writer(tmp_path / "data")
    name = "u.data" if writer is write_grouplens else "ml-100k.inter"
    with pytest.raises(ValueError, match=rf"{name}: column '{column}' must hold integers") as err:
        load_100k(tmp_path / "data", download=False)
    assert "data row 3" in str(err.value)


def test_bad_item_metadata_ids_are_rejected(tmp_path, monkeypatch):
    monkeypatch.setitem(globals(), "ITEMS", [*ITEMS, (-3, "Bad (1999)", ())])
    write_grouplens(tmp_path / "data")
    with pytest.raises(ValueError, match=r"u\.item: column 'item_id' must hold integers >= 1"):
        load_100k(tmp_path / "data", download=False)


def test_verbose_log_says_why_each_source_failed(tmp_path, monkeypatch, capsys):
    def grouplens(target):
        raise OSError("[Errno -3] Temporary failure in name resolution")

    def recbole(target):
        write_recbole(target)

    monkeypatch.setattr(movielens, "_from_grouplens", grouplens)
    monkeypatch.setattr(movielens, "_from_recbole_wheel", recbole)
    check(load_100k(verbose=True))
    out = capsys.readouterr().out
    failed = [line for line in out.splitlines() if "failed" in line]
    assert len(failed) == 1 and "GroupLens" in failed[0]
    assert "OSError: [Errno -3] Temporary failure in name resolution" in failed[0]
    assert "not in the cache" in out and "5 ratings from" in out


def test_pip_failure_reason_keeps_the_lines_that_say_why(tmp_path, monkeypatch):
    monkeypatch.setattr(movielens, "_from_recbole_wheel", _REAL_RECBOLE)
    stderr = (
        "WARNING: Retrying ... NewConnectionError: Failed to establish a new connection\n"
        "ERROR: Could not find a version that satisfies the requirement recbole==1.2.1\n"
        "ERROR: No matching distribution found for recbole==1.2.1\n"
    )

    def fake_run(cmd, **kwargs):
        return movielens.subprocess.CompletedProcess(cmd, 1, "", stderr)

    monkeypatch.setattr(movielens.subprocess, "run", fake_run)
    with pytest.raises(RuntimeError) as err:
        movielens._from_recbole_wheel(tmp_path / "out")
    text = str(err.value)
    assert "exit 1" in text and "NewConnectionError" in text and "No matching distribution" in text
