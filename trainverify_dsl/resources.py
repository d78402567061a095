"""Where the grammar, the plan library (``stdlib/``) and the project root are.

The files live in two layouts, and this module is the one place that knows both:

- a source checkout (also an editable install): the package folder sits beside ``grammar/``
  and ``stdlib/`` at the top of the repository, which is the project root;
- an installed package (a wheel, or ``pip install .``): ``setup.py`` maps ``grammar/`` and
  ``stdlib/`` into the package as ``trainverify_dsl/_data/grammar`` and
  ``trainverify_dsl/_data/stdlib``, and that ``_data`` folder plays the project root.

In both, ``stdlib/...`` paths (``use "stdlib/megatron.tvp"``, ``spec "stdlib/models/llama.py:
Llama"``, the ``file`` entries of ``configs.json``) are relative to ``stdlib_dir.parent``.
Nothing here reads the working directory or the environment.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
#: Where an installed package keeps its copy of grammar/ and stdlib/ (see setup.py).
BUNDLED_DIR_NAME = "_data"


@dataclass(frozen=True, slots=True)
class Resources:
    #: Root of relative ``use`` and ``spec`` paths after the plan's own folder.
    project_root: Path
    grammar_file: Path
    #: The folder that ``stdlib/...`` names: templates, and the reference models under models/.
    stdlib_dir: Path
    #: True for an installed package, False for a checkout.
    installed: bool

    @property
    def stdlib_base(self) -> Path:
        """The folder a ``stdlib/...`` path is relative to."""
        return self.stdlib_dir.parent

    @property
    def configs_file(self) -> Path:
        return self.stdlib_dir / "models" / "configs.json"


def locate(package_dir: Path = PACKAGE_DIR) -> Resources:
    """The layout ``package_dir`` (a ``trainverify_dsl`` folder) belongs to. The bundled copy
    wins when present: an installed package's parent is site-packages, not a checkout."""
    bundled = package_dir / BUNDLED_DIR_NAME
    if (bundled / "grammar" / "tvp.lark").is_file():
        return Resources(bundled, bundled / "grammar" / "tvp.lark", bundled / "stdlib", True)
    checkout = package_dir.parent
    return Resources(checkout, checkout / "grammar" / "tvp.lark", checkout / "stdlib", False)


RESOURCES = locate()
