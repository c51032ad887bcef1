"""An empty ratings file (``u.data`` / ``ml-100k.inter``) is an error naming the file, not a
dataset of 0 ratings (issue 31 item 14)."""

import pytest

from losszoo.datasets import load_100k, movielens
from tests.datasets.test_movielens import write_grouplens, write_recbole


@pytest.fixture(autouse=True)
def _no_network(tmp_path, monkeypatch):
    monkeypatch.setenv(movielens.CACHE_ENV, str(tmp_path / "cache"))

    def no_network(*args, **kwargs):
        raise AssertionError("the tests must not touch the network")

    monkeypatch.setattr(movielens, "_from_grouplens", no_network)
    monkeypatch.setattr(movielens, "_from_recbole_wheel", no_network)


@pytest.mark.parametrize("content", ["", "\n\n", "   \n"])
def test_an_empty_u_data_is_an_error_naming_the_file(tmp_path, content):
    write_grouplens(tmp_path / "data")
    (tmp_path / "data" / "u.data").write_text(content)
    with pytest.raises(ValueError, match=r"u\.data: holds no ratings"):
        load_100k(tmp_path / "data", download=False)


def test_a_header_only_recbole_file_is_an_error_naming_the_file(tmp_path):
    write_recbole(tmp_path / "data")
    path = tmp_path / "data" / "ml-100k.inter"
    path.write_text(path.read_text().splitlines()[0] + "\n")
    with pytest.raises(ValueError, match=r"ml-100k\.inter: holds no ratings"):
        load_100k(tmp_path / "data", download=False)
