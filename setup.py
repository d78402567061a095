"""Packaging beyond what pyproject.toml can say: the grammar and the plan library ship inside
the package while staying at the top of the repository.

``grammar/`` and ``stdlib/`` are mapped to ``trainverify_dsl/_data/grammar`` and
``trainverify_dsl/_data/stdlib`` in a built wheel (``pip install .``); ``trainverify_dsl/
resources.py`` finds them there, or beside the package in a checkout and an editable install.
Packages are discovered, so a new subpackage of trainverify_dsl ships without an edit here.
"""

from setuptools import find_packages, setup

#: Package name inside the wheel -> folder in the repository.
BUNDLED = {
    "trainverify_dsl._data.grammar": "grammar",
    "trainverify_dsl._data.stdlib": "stdlib",
    "trainverify_dsl._data.stdlib.models": "stdlib/models",
}

setup(
    packages=find_packages(include=["trainverify_dsl", "trainverify_dsl.*"]) + list(BUNDLED),
    package_dir=BUNDLED,
    package_data={
        "trainverify_dsl": ["py.typed"],
        **{name: ["*.lark", "*.tvp", "*.json"] for name in BUNDLED},
    },
)
