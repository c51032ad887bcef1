"""Data sets used by the examples. Nothing is shipped; loaders read local files or fetch them."""

from losszoo.datasets import movielens
from losszoo.datasets.movielens import load_100k

__all__ = ["load_100k", "movielens"]
