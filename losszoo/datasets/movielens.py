"""MovieLens 100K: loader (two file layouts, several sources), the 80/10/10 split, metrics.

The data is never shipped with losszoo (the GroupLens licence forbids redistribution). Sources,
tried in order by :func:`load_100k`:

1. an explicit ``data_dir`` (either layout, or a folder holding ``ml-100k.zip``);
2. the cache, ``$LOSSZOO_CACHE_DIR/movielens/ml-100k`` (default ``~/.cache/losszoo``);
3. the GroupLens download, https://files.grouplens.org/datasets/movielens/ml-100k.zip;
4. the ``recbole==1.2.1`` wheel from PyPI, which ships ``recbole/dataset_example/ml-100k/``:
   ``pip download --no-deps`` into a temporary folder, then only those files are extracted
   into the cache (recbole is never installed).

Layouts: GroupLens (``u.data`` tab-separated ``user item rating timestamp``; ``u.item``
``|``-separated, latin-1, 19 genre flags) and RecBole atomic files (``ml-100k.inter``,
``ml-100k.item`` with typed headers such as ``item_id:token``). Ids are kept as in the files
(1-based); :class:`MovieLens100K` also gives 0-based contiguous indices. The readers check
every rating file (ids positive integers, ratings integers from 1 to 5, timestamps
non-negative integers) and raise a ``ValueError`` naming the file and the column otherwise.
"""

from __future__ import annotations

import dataclasses
import io
import os
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from pathlib import Path

import numpy as np

GROUPLENS_URL = "https://files.grouplens.org/datasets/movielens/ml-100k.zip"
RECBOLE_REQUIREMENT = "recbole==1.2.1"
RECBOLE_PREFIX = "recbole/dataset_example/ml-100k/"
CACHE_ENV = "LOSSZOO_CACHE_DIR"

#: The genre flags of ``u.item``, in file order.
GENRES = tuple(
    "unknown Action Adventure Animation Children's Comedy Crime Documentary Drama Fantasy "
    "Film-Noir Horror Musical Mystery Romance Sci-Fi Thriller War Western".split()
)
#: The files taken from the GroupLens archive's ``ml-100k/`` folder.
_GROUPLENS_FILES = ("u.data", "u.item", "u.user", "u.genre", "README")


@dataclasses.dataclass
class MovieLens100K:
    """Ratings and item metadata.

    Attributes:
      user, item: int64 arrays of the raw (file) ids, one entry per rating.
      rating: float32 ratings (1-5). timestamp: int64 unix seconds.
      item_ids: int64 raw ids of the items in the metadata; titles: their titles;
        genres: a tuple of genre names per item.
      source: where the data was read from (a path).
    """

    user: np.ndarray
    item: np.ndarray
    rating: np.ndarray
    timestamp: np.ndarray
    item_ids: np.ndarray
    titles: list
    genres: list
    source: str = ""

    @property
    def num_ratings(self) -> int:
        return int(self.user.size)

    def indexed(self):
        """0-based contiguous ``(user_index, item_index, num_users, num_items)``.

        Items are indexed over the union of rated items and the metadata, sorted by raw id.
        """
        users = np.unique(self.user)
        items = np.unique(np.concatenate([self.item, self.item_ids]))
        return (
            np.searchsorted(users, self.user),
            np.searchsorted(items, self.item),
            users.size,
            items.size,
        )


# --------------------------------------------------------------------------- readers


#: column -> (smallest, largest) allowed integer; ratings of the 100K set are 1 to 5 stars.
_COLUMN_RANGES = {
    "user_id": (1, None),
    "item_id": (1, None),
    "rating": (1, 5),
    "timestamp": (0, None),
}


def _integers(path: Path, column: str, values) -> np.ndarray:
    """``values`` (strings or numbers) as int64, or a ValueError naming the file and column
    when one is not an integer in the column's range (:data:`_COLUMN_RANGES`)."""
    low, high = _COLUMN_RANGES[column]
    allowed = f"integers from {low} to {high}" if high else f"integers >= {low}"
    try:
        v = np.asarray(values, np.float64).reshape(-1)
    except ValueError as err:
        raise ValueError(f"{path}: column {column!r} must hold {allowed}: {err}.") from None
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(v) | (v != np.round(v)) | (v < low) | (v > (high or np.inf))
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(
            f"{path}: column {column!r} must hold {allowed}; data row {i + 1} holds "
            f"{v[i]:g} ({int(bad.sum())} bad row(s))."
        )
    return v.astype(np.int64)


def _ratings(path: Path, table) -> dict:
    """The ``user``, ``item``, ``rating``, ``timestamp`` fields of :class:`MovieLens100K` from
    ``table`` ([N, 4]: the columns of :data:`_COLUMN_RANGES`, in its order), checked."""
    table = np.asarray(table, dtype=object).reshape(-1, 4)
    if not len(table):  # an empty (e.g. truncated) download must not load as 0 ratings
        raise ValueError(
            f"{path}: holds no ratings (the file is empty or has only a header); the file is "
            "probably truncated: delete it and load or download MovieLens 100K again."
        )
    user, item, rating, timestamp = (
        _integers(path, column, table[:, j]) for j, column in enumerate(_COLUMN_RANGES)
    )
    return {"user": user, "item": item, "rating": rating.astype(np.float32), "timestamp": timestamp}


def _flagged_genres(flags) -> tuple:
    """The genres whose ``u.item`` flag is 1."""
    return tuple(genre for genre, flag in zip(GENRES, flags) if flag.strip() == "1")


def _read_grouplens(folder: Path) -> MovieLens100K:
    path = folder / "u.data"
    rows = [line.split() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    if any(len(row) != 4 for row in rows):
        raise ValueError(f"{path}: expected 4 tab-separated columns.")
    ratings = _ratings(path, rows)
    text = (folder / "u.item").read_bytes().decode("latin-1")
    items = [line.split("|") for line in text.splitlines() if line.strip()]
    return MovieLens100K(
        **ratings,
        item_ids=_integers(folder / "u.item", "item_id", [parts[0] for parts in items]),
        titles=[parts[1] for parts in items],
        genres=[_flagged_genres(parts[-len(GENRES) :]) for parts in items],
        source=str(folder),
    )


def _atomic_table(path: Path, required=()) -> list:
    """The rows of a RecBole atomic file (typed header ``name:type``) as ``{name: value}``
    (a missing value reads as ``""``); a ValueError if a ``required`` column is missing."""
    lines = path.read_bytes().decode("utf-8", errors="replace").splitlines()
    header = [h.split(":")[0] for h in lines[0].split("\t")]
    for name in required:
        if name not in header:
            raise ValueError(f"{path}: missing column {name!r} in header.")
    return [dict(zip(header, line.split("\t"))) for line in lines[1:] if line.strip()]


def _read_recbole(folder: Path) -> MovieLens100K:
    path = folder / "ml-100k.inter"
    rows = _atomic_table(path, _COLUMN_RANGES)
    ratings = _ratings(path, [[r.get(name, "") for name in _COLUMN_RANGES] for r in rows])
    item_path = folder / "ml-100k.item"
    items = _atomic_table(item_path, ("item_id",))
    return MovieLens100K(
        **ratings,
        item_ids=_integers(item_path, "item_id", [r.get("item_id", "") for r in items]),
        titles=[r.get("movie_title", "") for r in items],
        genres=[tuple(r.get("class", "").split()) for r in items],
        source=str(folder),
    )


def _find_layout(folder: Path):
    """The folder (itself or an ``ml-100k`` child) holding either layout, and a reader."""
    for candidate in (folder, folder / "ml-100k"):
        if (candidate / "u.data").is_file() and (candidate / "u.item").is_file():
            return candidate, _read_grouplens
        if (candidate / "ml-100k.inter").is_file() and (candidate / "ml-100k.item").is_file():
            return candidate, _read_recbole
    return None, None


def read_folder(folder) -> MovieLens100K:
    """Read MovieLens 100K from a folder in the GroupLens or RecBole layout (or a zip in it)."""
    folder = Path(folder).expanduser()
    if not folder.exists():
        raise FileNotFoundError(f"{folder} does not exist")
    if not folder.is_dir():
        raise NotADirectoryError(f"{folder} is not a folder")
    archive_path = folder / "ml-100k.zip"
    if _find_layout(folder)[0] is None and archive_path.is_file():
        try:
            with zipfile.ZipFile(archive_path) as archive:
                _extract_members(archive, "ml-100k/", folder / "ml-100k", _GROUPLENS_FILES)
        except zipfile.BadZipFile as err:
            raise ValueError(
                f"{archive_path} is not a valid zip archive ({err}); it is probably corrupt or "
                "an incomplete download. Delete it and download ml-100k.zip again from "
                f"{GROUPLENS_URL}, or put the extracted u.data and u.item in {folder}."
            ) from None
    found, reader = _find_layout(folder)
    if found is None:
        raise FileNotFoundError(
            f"{folder} holds neither u.data + u.item (GroupLens) nor ml-100k.inter + "
            "ml-100k.item (RecBole), nor ml-100k.zip"
        )
    return reader(found)


# --------------------------------------------------------------------------- sources


def cache_dir() -> Path:
    """``$LOSSZOO_CACHE_DIR/movielens/ml-100k`` (default ``~/.cache/losszoo/...``)."""
    root = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "losszoo"
    return Path(root).expanduser() / "movielens" / "ml-100k"


def _extract_members(archive: zipfile.ZipFile, prefix: str, target: Path, names):
    """Copy the archive's ``prefix + name`` members (those of ``names`` it holds) to
    ``target / name``."""
    target.mkdir(parents=True, exist_ok=True)
    members = set(archive.namelist())
    found = [name for name in names if prefix + name in members]
    if not found:
        raise FileNotFoundError(f"no files under {prefix} in the archive")
    for name in found:
        (target / name).write_bytes(archive.read(prefix + name))


def _from_grouplens(target: Path) -> None:
    with urllib.request.urlopen(GROUPLENS_URL, timeout=30) as response:
        payload = response.read()
    with zipfile.ZipFile(io.BytesIO(payload)) as archive:
        _extract_members(archive, "ml-100k/", target, _GROUPLENS_FILES)


def _from_recbole_wheel(target: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="losszoo-recbole-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check"]
        cmd += ["--quiet", RECBOLE_REQUIREMENT, "-d", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        wheels = list(Path(tmp).glob("recbole-*.whl"))
        if proc.returncode != 0 or not wheels:
            # pip's last lines say why (e.g. the connection error before "No matching ...")
            lines = [x for x in (proc.stderr or proc.stdout).splitlines() if x.strip()]
            reason = " | ".join(x.strip() for x in lines[-3:]) or "no wheel was downloaded"
            raise RuntimeError(f"`{' '.join(cmd[2:])}` failed (exit {proc.returncode}): {reason}")
        with zipfile.ZipFile(wheels[0]) as archive:
            _extract_members(
                archive, RECBOLE_PREFIX, target, ("ml-100k.inter", "ml-100k.item", "ml-100k.user")
            )


def load_100k(data_dir=None, download: bool = True, verbose: bool = False) -> MovieLens100K:
    """Load MovieLens 100K (943 users, 1682 movies, 100,000 ratings).

    Args:
      data_dir: a folder with the data in the GroupLens layout (``u.data``, ``u.item``; or the
        ``ml-100k.zip``) or the RecBole layout (``ml-100k.inter``, ``ml-100k.item``). Tried first.
      download: when the data is neither in ``data_dir`` nor in the cache, fetch it: from
        GroupLens, else from the ``recbole==1.2.1`` wheel on PyPI (only the data files are
        extracted; recbole is not installed). Downloads go to :func:`cache_dir`.
      verbose: print which source was used.

    Returns:
      :class:`MovieLens100K`.

    Raises:
      FileNotFoundError: ``data_dir`` is given but holds no readable copy (the cache and the
        downloads are then *not* tried: a typo must not silently load other data), or, with
        ``data_dir=None``, no source worked; the message lists every source tried and why.
      ValueError: a corrupt ``ml-100k.zip`` or malformed files in ``data_dir`` (including ids
        that are not positive integers and ratings that are not integers from 1 to 5), naming
        the file and the column.
      TypeError: ``data_dir`` is not a path, or ``download`` / ``verbose`` is not a bool.
    """
    if data_dir is not None and not isinstance(data_dir, (str, os.PathLike)):
        raise TypeError(
            f"`data_dir` must be a path (str or os.PathLike) or None, got "
            f"{type(data_dir).__name__}."
        )
    for arg, value in (("download", download), ("verbose", verbose)):
        if not isinstance(value, bool):
            raise TypeError(f"`{arg}` must be True or False, got {value!r}.")
    if data_dir is not None:
        try:
            return _report(read_folder(data_dir), verbose)
        except OSError as err:
            raise FileNotFoundError(
                f"`data_dir`={str(data_dir)!r} holds no MovieLens 100K copy: {err}. Fix the "
                "path, or pass data_dir=None to use the cache / download."
            ) from None
        except ValueError as err:
            raise ValueError(f"`data_dir`={str(data_dir)!r}: {err}") from None
    failures = []
    cached = cache_dir()
    try:
        return _report(read_folder(cached), verbose)
    except (OSError, ValueError) as err:
        failures.append(f"cache {cached} (set ${CACHE_ENV} to move it): {err}")
        if verbose:
            print(f"MovieLens 100K: not in the {failures[-1]}", flush=True)
    if download:
        for label, fetch in (
            ("GroupLens download " + GROUPLENS_URL, _from_grouplens),
            (f"PyPI wheel {RECBOLE_REQUIREMENT} (pip download --no-deps)", _from_recbole_wheel),
        ):
            try:
                if verbose:
                    print(f"MovieLens 100K: trying {label} ...", flush=True)
                fetch(cached)
                return _report(read_folder(cached), verbose)
            except Exception as err:  # noqa: BLE001 - every failure is reported below
                failures.append(f"{label}: {type(err).__name__}: {err}")
                if verbose:
                    print(f"MovieLens 100K: failed: {failures[-1]}", flush=True)
    else:
        failures.append("downloads disabled (download=False)")
    raise FileNotFoundError(
        "Could not load MovieLens 100K. Tried, in order:\n  - "
        + "\n  - ".join(failures)
        + "\nPut u.data and u.item (GroupLens) or ml-100k.inter and ml-100k.item (RecBole) in "
        "a folder and pass it as data_dir."
    )


def _report(data: MovieLens100K, verbose: bool) -> MovieLens100K:
    if verbose:
        print(f"MovieLens 100K: {data.num_ratings} ratings from {data.source}", flush=True)
    return data


# --------------------------------------------------------------------------- split + metrics


@dataclasses.dataclass
class Split:
    """(user, item) index pairs of each part; indices are 0-based (see ``indexed``)."""

    train: np.ndarray  # [P, 2]
    validation: np.ndarray
    test: np.ndarray
    num_users: int
    num_items: int


def _integer(value, name: str, what: str = "hold positive integers", low: int = 1) -> int:
    """``value`` as an int; a ValueError "`name` must <what>" unless it is an integer >= ``low``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"`{name}` must {what}, got {value!r}.")
    return int(value)


def split_pairs(data: MovieLens100K, seed: int = 0, fractions=(0.8, 0.1, 0.1)) -> Split:
    """The Rankmax paper's protocol: a random 80/10/10 split of the distinct (user, item) pairs.

    Every rating counts as an implicit positive. The split is over pairs (not users), so a
    user's items are spread over the three parts.
    """
    seed = _integer(seed, "seed", "be a non-negative integer", low=0)
    try:
        values = np.asarray(fractions, np.float64)
    except (TypeError, ValueError):
        values = np.full(1, np.nan)
    # NaN fails `>= 0`, and an infinite sum is not close to 1
    if values.shape != (3,) or not (np.all(values >= 0) and np.isclose(values.sum(), 1.0)):
        raise ValueError(
            f"`fractions` must be three non-negative numbers summing to 1, got {fractions}."
        )
    u, i, nu, ni = data.indexed()
    pairs = np.unique(np.stack([u, i], 1), axis=0)
    order = np.random.default_rng(seed).permutation(len(pairs))
    a = int(round(fractions[0] * len(pairs)))
    b = a + int(round(fractions[1] * len(pairs)))
    return Split(pairs[order[:a]], pairs[order[a:b]], pairs[order[b:]], nu, ni)


def pairs_to_mask(pairs: np.ndarray, num_users: int, num_items: int) -> np.ndarray:
    """``[num_users, num_items]`` bool mask, True at the 0-based ``(user, item)`` ``pairs``."""
    num_users = _integer(num_users, "num_users", "be a positive integer")
    num_items = _integer(num_items, "num_items", "be a positive integer")
    pairs = np.asarray(pairs)
    integer = pairs.size == 0 or np.issubdtype(pairs.dtype, np.integer)  # [] is float
    if pairs.ndim != 2 or pairs.shape[1] != 2 or not integer:
        raise ValueError(
            f"`pairs` must be integer (user, item) indices of shape [P, 2], got "
            f"shape {pairs.shape} and dtype {pairs.dtype}."
        )
    pairs = pairs.astype(np.int64)
    if pairs.size and (pairs.min() < 0 or np.any(pairs.max(0) >= (num_users, num_items))):
        raise ValueError(
            f"`pairs` must hold 0-based indices below (num_users, num_items) = "
            f"({num_users}, {num_items}); got (user, item) minima {pairs.min(0).tolist()} "
            f"and maxima {pairs.max(0).tolist()}."
        )
    mask = np.zeros((num_users, num_items), bool)
    mask[pairs[:, 0], pairs[:, 1]] = True
    return mask


def _mask_argument(value, name, shape):
    mask = np.asarray(value)
    if mask.shape != shape:
        raise ValueError(f"`{name}` must have the shape of `scores` {shape}, got {mask.shape}.")
    if mask.dtype != bool:
        if not (np.issubdtype(mask.dtype, np.number) and np.all((mask == 0) | (mask == 1))):
            raise ValueError(
                f"`{name}` must be a bool mask (or 0/1 values); got dtype "
                f"{mask.dtype} with other values."
            )
        mask = mask.astype(bool)
    return mask


def ranking_metrics(scores, heldout, exclude=None, ks=(1, 5, 10, 50, 100), ap_k=10):
    """Rank all items per user and score against the user's held-out items.

    Args:
      scores: ``[U, I]`` real scores (higher is better); ``-inf`` ranks an item last. NaN
        and ``+inf`` are rejected (a NaN has no rank).
      heldout: ``[U, I]`` bool, the items to find (e.g. the test pairs).
      exclude: ``[U, I]`` bool, items removed from the ranking (e.g. the user's training
        items). Must not overlap ``heldout`` (an item both to find and removed is ambiguous).
      ks: cut-offs for Recall@K (positive integers). ap_k: the cut-off of AP.
        Cut-offs larger than the number of items rank every item (so with 5 items, AP@10 is
        AP over all 5 positions and R@100 the recall of the whole ranking).

    Returns:
      dict with ``AP@{ap_k}``, ``Accuracy`` (top-1 hit = Precision@1) and ``R@K`` for each K,
      averaged over users with at least one held-out item (spec section 5 definitions), and
      ``users`` (how many were averaged).

    Raises:
      ValueError: naming the argument: shapes that differ, non-2-D or empty ``scores``, NaN or
        +inf scores, non-bool masks, overlapping ``heldout`` and ``exclude``, non-positive
        cut-offs, or no user with a held-out item (nothing to average).
    """
    scores = np.asarray(scores)
    if scores.ndim != 2 or scores.size == 0 or not np.issubdtype(scores.dtype, np.number):
        raise ValueError(
            f"`scores` must be a non-empty numeric [users, items] array, got shape "
            f"{scores.shape} and dtype {scores.dtype}."
        )
    scores = scores.astype(np.float64)
    if np.isnan(scores).any() or np.isposinf(scores).any():
        raise ValueError("`scores` must not hold NaN or +inf (-inf is allowed: ranked last).")
    heldout = _mask_argument(heldout, "heldout", scores.shape)
    if exclude is not None:
        exclude = _mask_argument(exclude, "exclude", scores.shape)
        if (exclude & heldout).any():
            raise ValueError(
                "`heldout` and `exclude` overlap: an item cannot be both found and "
                "removed from the ranking."
            )
        scores = np.where(exclude, -np.inf, scores)
    ks = tuple(_integer(k, "ks") for k in np.atleast_1d(np.asarray(ks, dtype=object)))
    if not ks:
        raise ValueError("`ks` must hold at least one cut-off.")
    ap_k = _integer(ap_k, "ap_k")
    users = heldout.sum(1) > 0
    if not users.any():
        raise ValueError("`heldout` has no user with a held-out item: nothing to average.")
    scores, heldout = scores[users], heldout[users]
    top = np.argsort(-scores, axis=1, kind="stable")[:, : max(*ks, ap_k)]  # ties: lower index
    rel = np.take_along_axis(heldout, top, 1).astype(np.float64)
    count = heldout.sum(1).astype(np.float64)
    out = {}
    hits = rel[:, :ap_k]
    prec = np.cumsum(hits, 1) / np.arange(1, hits.shape[1] + 1)
    out[f"AP@{ap_k}"] = float(np.mean((hits * prec).sum(1) / np.minimum(ap_k, count)))
    out["Accuracy"] = float(np.mean(rel[:, 0]))
    for k in ks:
        out[f"R@{k}"] = float(np.mean(rel[:, :k].sum(1) / count))
    out["users"] = int(users.sum())
    return out
