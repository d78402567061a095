"""Load a model from a reference: ``path/to/file.py:Class`` or a config name.

A bare name (``llama3_405b``) is looked up in ``stdlib/models/configs.json`` (its entry names
the ``model`` class and its ``file``). ``file.py:Class`` resolves the path against the current
directory, then the project root; files under the project root are imported as modules of the
checkout (so ``stdlib.models.common`` imports work), other files by path. With ``fake=True``
(the default) the model is built under a ``FakeTensorMode``: no weights are allocated.
Every failure is a ``SpecError`` carrying a diagnostic.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainverify_dsl import PROJECT_ROOT
from trainverify_dsl.report import codes_spec as codes
from trainverify_dsl.spec.errors import fail

CONFIGS_PATH = PROJECT_ROOT / "stdlib" / "models" / "configs.json"


@dataclass(frozen=True, slots=True)
class ModelRef:
    file: Path
    class_name: str
    config: str | None


def read_configs() -> dict[str, dict[str, Any]]:
    try:
        return json.loads(CONFIGS_PATH.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _did_you_mean(name: str, options: list[str]) -> str | None:
    import difflib

    close = difflib.get_close_matches(name, options, n=1)
    return f"did you mean {close[0]!r}?" if close else None


def resolve_ref(ref: str, config: str | None = None) -> ModelRef:
    """The file, class and config a model reference names (no import yet)."""
    if ":" not in ref:
        configs = read_configs()
        if ref not in configs:
            raise fail(codes.MODEL_NOT_FOUND, f"{ref!r} is neither file.py:Class nor a known "
                       "config name", ref, help=_did_you_mean(ref, sorted(configs)))
        entry = configs[ref]
        return ModelRef(PROJECT_ROOT / entry["file"], entry["model"], config or ref)
    path_text, _, class_name = ref.rpartition(":")
    for base in (Path.cwd(), PROJECT_ROOT):
        path = (base / path_text).resolve()
        if path.is_file():
            return ModelRef(path, class_name, config)
    raise fail(codes.MODEL_NOT_FOUND, f"model file {path_text!r} not found", ref)


def _import_file(path: Path) -> Any:
    if str(PROJECT_ROOT) not in sys.path:
        sys.path.insert(0, str(PROJECT_ROOT))
    try:
        relative = path.relative_to(PROJECT_ROOT)
    except ValueError:
        relative = None
    if relative is not None and all(p.isidentifier() for p in relative.with_suffix("").parts):
        return importlib.import_module(".".join(relative.with_suffix("").parts))
    name = f"tvp_user_model_{abs(hash(path))}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered like any import, so the module's classes can be inspected (source lines
    # in diagnostics) and its dataclasses resolve their annotations.
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


#: What user code may raise while it is imported, constructed or traced: any exception, and
#: ``sys.exit()`` too (a script-style model file must not end ``tvp`` with its own status).
USER_CODE_ERRORS = (Exception, SystemExit)


def _model_class(ref: ModelRef) -> Any:
    from torch import nn

    try:
        module = _import_file(ref.file)
    except USER_CODE_ERRORS as error:
        raise fail(codes.MODEL_LOAD_FAILED, f"importing {ref.file.name} failed: "
                   f"{type(error).__name__}: {error}", str(ref.file)) from None
    cls = getattr(module, ref.class_name, None)
    if cls is None:
        names = [n for n in vars(module) if isinstance(vars(module)[n], type)]
        raise fail(codes.MODEL_NOT_FOUND, f"{ref.file.name} has no class {ref.class_name!r}",
                   str(ref.file), help=_did_you_mean(ref.class_name, names))
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        what = "a class" if isinstance(cls, type) else f"a {type(cls).__name__}"
        raise fail(codes.MODEL_NOT_FOUND, f"{ref.file.name}:{ref.class_name} is {what}, "
                   "not a torch.nn.Module subclass", str(ref.file),
                   help="name the nn.Module class whose forward returns the loss")
    return cls


def _construct(cls: Any, ref: ModelRef, overrides: dict[str, Any]) -> Any:
    if ref.config is None:
        return cls(**overrides)
    if not hasattr(cls, "from_config_name"):
        raise fail(codes.CONFIG_NOT_FOUND, f"{cls.__name__} has no from_config_name, so "
                   f"config {ref.config!r} cannot be used", str(ref.file))
    configs = read_configs()
    if configs and ref.config not in configs:
        raise fail(codes.CONFIG_NOT_FOUND, f"unknown config {ref.config!r}", str(ref.file),
                   help=_did_you_mean(ref.config, sorted(configs)))
    return cls.from_config_name(ref.config, **overrides)


def load_model(ref: str, config: str | None = None, *, fake: bool = True,
               **overrides: Any) -> Any:
    """The ``nn.Module`` a reference names, built on fake tensors unless ``fake=False``."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    model_ref = resolve_ref(ref, config)
    cls = _model_class(model_ref)
    try:
        if fake:
            with FakeTensorMode(allow_non_fake_inputs=True):
                return _construct(cls, model_ref, overrides)
        return _construct(cls, model_ref, overrides)
    except KeyError as error:
        raise fail(codes.CONFIG_NOT_FOUND, str(error).strip("'\""), str(model_ref.file)) \
            from None
    except USER_CODE_ERRORS as error:  # constructors may raise anything
        if type(error).__name__ == "SpecError":
            raise
        needs_config = model_ref.config is None and hasattr(cls, "from_config_name")
        raise fail(codes.MODEL_LOAD_FAILED, f"constructing {cls.__name__} failed: "
                   f"{type(error).__name__}: {error}", str(model_ref.file),
                   help="this model is built from a named config: pass --config NAME "
                        "(see stdlib/models/configs.json)" if needs_config else None) from None


def model_input_specs(model: Any, batch: int, seq: int, where: str = "") -> Any:
    """``model.input_specs(batch, seq)``; a bad size, a missing method or one that raises is a
    ``SpecError`` (the specs themselves are checked when the tracer builds its inputs)."""
    for name, value in (("batch", batch), ("seq", seq)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise fail(codes.BAD_INPUT_SPEC, f"{name} must be a whole number of at least 1, "
                       f"got {value!r}", where)
    method = getattr(type(model), "input_specs", None)
    if not callable(method):
        raise fail(codes.BAD_INPUT_SPEC, f"{type(model).__name__} has no input_specs(batch, "
                   "seq) method", where, help="add input_specs returning {name: (shape, "
                   "dtype)} in forward argument order (see docs/models.md)")
    try:
        return model.input_specs(batch, seq)
    except USER_CODE_ERRORS as error:
        raise fail(codes.BAD_INPUT_SPEC, f"{type(model).__name__}.input_specs({batch}, {seq}) "
                   f"failed: {type(error).__name__}: {error}", where) from None
