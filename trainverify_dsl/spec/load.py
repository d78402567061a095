"""Load a model from a reference: ``path/to/file.py:Class`` or a config name.

A model file is Python code and importing it runs it, so where a reference may lead is
decided before anything is imported (``ModelAccess``):

- a bare name (``llama3_405b``) is looked up in the shipped ``stdlib/models/configs.json``
  (its entry names the ``model`` class and its ``file``);
- ``stdlib/...`` names the shipped plan library only, never a folder of that name elsewhere;
- any other relative path is looked up in the plan's folder (for ``tvp spec``, the folder the
  command was run from), then the project root — never the working directory of a plan run;
- the file found, symlinks resolved, must lie inside that folder, the project root or the
  stdlib, unless the caller allows it explicitly (``--allow-model-outside-root``); a refused
  file is never imported.

Stdlib models are imported as ``stdlib.models.NAME`` from the shipped stdlib (so their
``stdlib.models.common`` imports work, installed or not), other files by path. With
``fake=True`` (the default) the model is built under a ``FakeTensorMode``: no weights are
allocated. Every failure is a ``SpecError`` carrying a diagnostic.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import keyword
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from trainverify_dsl.report import codes_spec as codes
from trainverify_dsl.resources import RESOURCES
from trainverify_dsl.spec.errors import SpecError, error_text, fail

CONFIGS_PATH = RESOURCES.configs_file
#: The package name the shipped stdlib is imported under (its models import each other so).
STDLIB_PACKAGE = "stdlib"


@dataclass(frozen=True, slots=True)
class ModelRef:
    file: Path
    class_name: str
    config: str | None


@dataclass(frozen=True, slots=True)
class ModelAccess:
    """Where relative model paths are looked up, and whether a file outside the allowed roots
    (``base``, the project root, the stdlib) may be imported. The default allows only the
    project root and the stdlib."""

    #: The plan's folder (or, for ``tvp spec``, the folder the command ran in).
    base: Path | None = None
    allow_outside_root: bool = False

    def search_dirs(self, path_text: str) -> tuple[Path, ...]:
        if Path(path_text).parts[:1] == (STDLIB_PACKAGE,):
            return (RESOURCES.stdlib_base,)
        bases = (self.base, RESOURCES.project_root, RESOURCES.stdlib_base)
        return tuple(dict.fromkeys(b for b in bases if b is not None))

    def roots(self) -> tuple[Path, ...]:
        roots = (self.base, RESOURCES.project_root, RESOURCES.stdlib_dir)
        return tuple(dict.fromkeys(r.resolve() for r in roots if r is not None))


#: Confined to the project root and the stdlib: the default of every loading function.
DEFAULT_ACCESS = ModelAccess()


def read_configs() -> dict[str, dict[str, Any]]:
    try:
        return json.loads(CONFIGS_PATH.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _did_you_mean(name: str, options: list[str]) -> str | None:
    import difflib

    close = difflib.get_close_matches(name, options, n=1)
    return f"did you mean {close[0]!r}?" if close else None


def resolve_ref(ref: str, config: str | None = None,
                access: ModelAccess = DEFAULT_ACCESS) -> ModelRef:
    """The file, class and config a model reference names, checked against ``access``.
    Nothing is imported."""
    if ":" not in ref:
        configs = read_configs()
        if ref not in configs:
            raise fail(codes.MODEL_NOT_FOUND, f"{ref!r} is neither file.py:Class nor a known "
                       "config name", ref, help=_did_you_mean(ref, sorted(configs)))
        entry = configs[ref]
        return ModelRef(_find_file(entry["file"], ref, access), entry["model"], config or ref)
    path_text, _, class_name = ref.rpartition(":")
    return ModelRef(_find_file(path_text, ref, access), class_name, config)


def _find_file(path_text: str, ref: str, access: ModelAccess) -> Path:
    tried = []
    for base in access.search_dirs(path_text):
        candidate = base / path_text
        tried.append(str(candidate))
        try:
            real = candidate.resolve() if candidate.is_file() else None
        except (OSError, RuntimeError):  # a name too long, a symlink loop: no file
            real = None
        if real is not None:
            _check_confined(real, path_text, ref, access)
            return real
    raise fail(codes.MODEL_NOT_FOUND, f"model file {path_text!r} not found", ref,
               notes=tuple(f"looked for {t}" for t in dict.fromkeys(tried)))


def _check_confined(real: Path, path_text: str, ref: str, access: ModelAccess) -> None:
    roots = access.roots()
    if access.allow_outside_root or any(_within(real, root) for root in roots):
        return
    raise fail(codes.MODEL_OUTSIDE_ROOT, f"model file {path_text!r} lies outside the allowed "
               "folders; it was not imported", ref,
               notes=(f"it resolves to {real}",
                      "allowed roots: " + ", ".join(str(r) for r in roots)),
               help="move the model next to the plan or into the project; if you trust "
                    "this file, pass --allow-model-outside-root")


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _import_file(path: Path) -> ModuleType:
    _forget_edited_modules()
    stdlib_dir = RESOURCES.stdlib_dir.resolve()
    try:
        if _within(path, stdlib_dir):
            return _import_stdlib_module(path, stdlib_dir)
        return _import_by_path(path)
    finally:
        _forget_edited_modules()  # records the digests of what the import brought in


#: module name -> (the module object's id, its file when it is Python source outside the
#: interpreter's installation and this package — model files, the helper modules they
#: import, the shipped models — else ``None``): classified once per module object
_KIND: dict[str, tuple[int, Path | None]] = {}
#: user module name -> ((mtime, size) and digest of its file's bytes when first met)
_MET: dict[str, tuple[tuple[int, int], str]] = {}
_PACKAGE_DIR = Path(__file__).resolve().parents[1]
#: the interpreter's installation (its standard library and site-packages)
_INSTALLED = frozenset(Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix))


def _user_file(module: Any) -> Path | None:
    file = getattr(module, "__file__", None)
    if not isinstance(file, str) or not file.endswith(".py"):
        return None
    where = Path(file).resolve()
    if _within(where, _PACKAGE_DIR) or any(_within(where, root) for root in _INSTALLED):
        return None
    return where


def _stamp(path: Path) -> tuple[int, int]:
    try:
        found = path.stat()
    except OSError:
        return (-1, -1)
    return (found.st_mtime_ns, found.st_size)


def _forget_edited_modules() -> None:
    """Drop from ``sys.modules`` every user module whose file changed since it was met, and
    then every model file imported (they may have bound the old code): a process that checks
    again after ``helper.py``, which the model imports, was edited runs the edited code. A
    model file's own edits are met by its name (``_import_by_path``). A file is read again
    only when its modification time or size changed."""
    edited = False
    for name, module in list(sys.modules.items()):
        kind = _KIND.get(name)
        if kind is None or kind[0] != id(module):
            kind = _KIND[name] = (id(module), _user_file(module))
        where = kind[1]
        if where is None:
            continue
        stamp = _stamp(where)
        met = _MET.get(name)
        if met is None:
            _MET[name] = (stamp, _digest(where))
        elif met[0] != stamp:
            digest = _digest(where)
            if digest == met[1]:
                _MET[name] = (stamp, digest)  # touched, not changed
            else:
                edited = True
                del sys.modules[name], _MET[name], _KIND[name]
    if edited:
        for name in [n for n in sys.modules if n.startswith(_USER_PREFIX)]:
            del sys.modules[name]
            _MET.pop(name, None)
            _KIND.pop(name, None)


def _digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    except OSError:
        return "unreadable"


_USER_PREFIX = "tvp_user_model_"


def _import_stdlib_module(path: Path, stdlib_dir: Path) -> ModuleType:
    """``stdlib/models/llama.py`` as ``stdlib.models.llama``, the ``stdlib`` package bound to
    the shipped folder (not found on ``sys.path``, where the working directory may come
    first). The module imported must be the file that was checked."""
    _stdlib_package(stdlib_dir)
    parts = path.relative_to(stdlib_dir).with_suffix("").parts
    module = importlib.import_module(".".join((STDLIB_PACKAGE, *parts)))
    imported = Path(getattr(module, "__file__", "") or "").resolve()
    if imported != path:
        raise ImportError(f"{module.__name__} is already imported from {imported}")
    return module


def _stdlib_package(stdlib_dir: Path) -> ModuleType:
    existing = sys.modules.get(STDLIB_PACKAGE)
    if existing is not None:
        paths = [Path(p).resolve() for p in getattr(existing, "__path__", ())]
        if paths != [stdlib_dir]:
            raise ImportError(f"another package named {STDLIB_PACKAGE!r} is already imported "
                              f"(from {', '.join(map(str, paths)) or 'no folder'})")
        return existing
    spec = importlib.util.spec_from_file_location(
        STDLIB_PACKAGE, stdlib_dir / "__init__.py", submodule_search_locations=[str(stdlib_dir)])
    assert spec is not None and spec.loader is not None
    return _execute(spec)


def _import_by_path(path: Path) -> ModuleType:
    """A model file outside the stdlib, under a name of its own; imported once per process
    and content (``tvp simulate`` loads the model twice, fake and real). The name holds a
    digest of the file's bytes: a process that checks again after the file was edited (the
    Python API in a search loop or a notebook, the language server) imports the edited
    model, not the one it met first."""
    name = f"{_USER_PREFIX}{abs(hash(path))}_{_digest(path)}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:  # not a Python source file (m.txt)
        raise fail(codes.MODEL_LOAD_FAILED, f"{path.name} is not a Python file: a model file "
                   "ends in .py", str(path), help="name the .py file that defines the model "
                   "class: `spec \"models/my_model.py:MyModel\"`")
    return _execute(spec)


def _execute(spec: importlib.machinery.ModuleSpec) -> ModuleType:
    module = importlib.util.module_from_spec(spec)
    # Registered like any import, so the module's classes can be inspected (source lines
    # in diagnostics) and its dataclasses resolve their annotations.
    sys.modules[spec.name] = module
    try:
        assert spec.loader is not None
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[spec.name]
        raise
    return module


#: What user code may raise while it is imported, constructed or traced: any exception, and
#: ``sys.exit()`` too (a script-style model file must not end ``tvp`` with its own status).
USER_CODE_ERRORS = (Exception, SystemExit)


def model_class(ref: ModelRef) -> Any:
    from torch import nn

    try:
        module = _import_file(ref.file)
    except SpecError:
        raise
    except USER_CODE_ERRORS as error:
        raise fail(codes.MODEL_LOAD_FAILED, f"importing {ref.file.name} failed: "
                   f"{error_text(error)}", str(ref.file)) from None
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
        return cls(**keyword_settings(cls, overrides))
    if not hasattr(cls, "from_config_name"):
        raise fail(codes.CONFIG_NOT_FOUND, f"{cls.__name__} has no from_config_name, so "
                   f"config {ref.config!r} cannot be used", str(ref.file))
    configs = read_configs()
    if configs and ref.config not in configs:
        raise fail(codes.CONFIG_NOT_FOUND, f"unknown config {ref.config!r}", str(ref.file),
                   help=_did_you_mean(ref.config, sorted(configs)))
    return cls.from_config_name(ref.config, **overrides)


def keyword_settings(cls: Any, settings: dict[str, Any]) -> dict[str, Any]:
    """Spec-line settings (``spec "m.py:Net" ... tie false d 8``) as the keyword arguments of
    a model built without a named config, typed as the shipped models type their config
    fields (docs/language.md): ``true`` and ``false`` are the plan's yes/no words, never the
    strings (``"false"`` is true in Python); an argument annotated ``bool`` takes nothing
    else, one annotated ``int`` or ``float`` a number. A ValueError names what to write (the
    caller reports it at the spec line)."""
    import inspect

    try:
        parameters = inspect.signature(cls).parameters
    except (TypeError, ValueError):  # a constructor without a readable signature
        parameters = {}
    typed = {}
    for key, value in settings.items():
        parameter = parameters.get(key)
        kind = parameter.annotation if parameter is not None else inspect.Parameter.empty
        name = "" if kind is inspect.Parameter.empty else \
            (kind.__name__ if isinstance(kind, type) else str(kind)).replace(
                " ", "").removesuffix("|None")
        if name.startswith(("Optional[", "typing.Optional[")) and name.endswith("]"):
            name = name[name.index("[") + 1:-1]
        is_number = isinstance(value, int | float) and not isinstance(value, bool)
        if value in ("true", "false") and name in ("", "bool"):
            value = value == "true"
        elif name == "bool" and not isinstance(value, bool):
            raise ValueError(f"{key} is a yes/no setting: write `{key} true` or `{key} "
                             f"false`, not {value!r}")
        elif name == "int" and not (is_number and float(value).is_integer()):
            raise ValueError(f"{key} is a whole number: write e.g. `{key} 8`, not {value!r}")
        elif name == "float" and not is_number:
            raise ValueError(f"{key} is a number: write e.g. `{key} 0.1`, not {value!r}")
        elif name == "int":
            value = int(value)
        elif name == "float":
            value = float(value)
        typed[key] = value
    return typed


def load_model(ref: str | ModelRef, config: str | None = None, *, fake: bool = True,
               access: ModelAccess = DEFAULT_ACCESS, **overrides: Any) -> Any:
    """The ``nn.Module`` a reference names (a ``ModelRef`` is already resolved; a string is
    resolved under ``access`` first), built on fake tensors unless ``fake=False``."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    model_ref = ref if isinstance(ref, ModelRef) else resolve_ref(ref, config, access)
    cls = model_class(model_ref)
    try:
        if fake:
            with FakeTensorMode(allow_non_fake_inputs=True):
                model = _construct(cls, model_ref, overrides)
        else:
            model = _construct(cls, model_ref, overrides)
    except KeyError as error:
        raise fail(codes.CONFIG_NOT_FOUND, str(error).strip("'\""), str(model_ref.file)) \
            from None
    except USER_CODE_ERRORS as error:  # constructors may raise anything
        if type(error).__name__ == "SpecError":
            raise
        needs_config = model_ref.config is None and hasattr(cls, "from_config_name")
        raise fail(codes.MODEL_LOAD_FAILED, f"constructing {cls.__name__} failed: "
                   f"{error_text(error)}", str(model_ref.file),
                   help="this model is built from a named config: pass --config NAME "
                        "(see stdlib/models/configs.json)" if needs_config else None) from None
    _refuse_unusable_names(model, cls.__name__, str(model_ref.file))
    frozen = [name for name, p in getattr(model, "named_parameters", lambda: ())()
              if not p.requires_grad]
    if frozen:
        shown = ", ".join(f"`{n}`" for n in frozen[:3]) + \
            (f" and {len(frozen) - 3} more" if len(frozen) > 3 else "")
        many = len(frozen) > 1
        raise fail(codes.FROZEN_PARAMETER, f"{cls.__name__}'s parameter{'s' if many else ''} "
                   f"{shown} {'do' if many else 'does'} not require a gradient "
                   "(frozen): the training step checked gives every parameter a gradient and "
                   "an update, and frozen parameters are not supported yet",
                   str(model_ref.file), help="a constant is a buffer: `self.register_buffer("
                   "name, tensor)`; a weight that trains needs `requires_grad=True`")
    return model


def _refuse_unusable_names(model: Any, cls: str, where: str) -> None:
    """TVP315 for a parameter or buffer with a Python keyword in its name (torch.export's
    generated code cannot name it) or named ``loss`` (the step's loss in plans and IR), and
    for a module named ``loss`` (a plan's `loss` is the step's loss)."""
    if any(name == "loss" for name, _ in getattr(model, "named_modules", lambda: ())()):
        raise fail(codes.UNUSABLE_NAME, f"{cls}'s submodule `loss` cannot be addressed "
                   "under this name: in a plan `loss` is the step's loss (`pipeline-stage 1: "
                   "..., loss`)", where, help="rename the module (for example `loss_fn`)")
    named = list(getattr(model, "named_parameters", lambda: ())()) + \
        list(getattr(model, "named_buffers", lambda: ())())
    for name, _ in named:
        keywords = [part for part in name.split(".") if keyword.iskeyword(part)]
        if keywords or name == "loss":
            why = f"`{keywords[0]}` is a Python keyword, which torch.export cannot trace" \
                if keywords else "`loss` is the name plans and the IR give the step's loss"
            raise fail(codes.UNUSABLE_NAME, f"{cls}'s `{name}` cannot be checked under this "
                       f"name: {why}", where, help="rename it in the model (for example "
                       f"`{name.replace('.', '_')}_w`)")


def unbatched_inputs(model: Any) -> frozenset[str]:
    """The model inputs with a dimension 0 that is not the batch (docs/semantics.md Rule
    4.1): ``input_specs`` at two batch sizes gives them the same one (a per-feature scale,
    a table passed in). Empty when the model cannot say (its ``input_specs`` fails at the
    small sizes asked): every input is then read as batched, as before."""
    from trainverify_dsl.spec.errors import SpecError

    try:
        small, large = (dict(model_input_specs(model, b, 4)) for b in (2, 3))
    except (SpecError, *USER_CODE_ERRORS):
        return frozenset()
    found = set()
    for name, spec in small.items():
        other = large.get(name)
        try:
            shape, wider = tuple(spec[0]), tuple(other[0]) if other is not None else None
        except (TypeError, IndexError):
            return frozenset()
        if shape and wider is not None and len(wider) == len(shape) and shape[0] == wider[0]:
            found.add(name)
    return frozenset(found)


def model_input_specs(model: Any, batch: int, seq: int, where: str = "") -> Any:
    """``model.input_specs(batch, seq)``; a bad size, a missing method, one that raises or
    returns something other than ``{name: (shape, dtype)}`` is a ``SpecError``."""
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
        specs = model.input_specs(batch, seq)
    except USER_CODE_ERRORS as error:
        raise fail(codes.BAD_INPUT_SPEC, f"{type(model).__name__}.input_specs({batch}, {seq}) "
                   f"failed: {error_text(error)}", where) from None
    from trainverify_dsl.spec.trace import check_input_specs

    check_input_specs(specs, where)
    if "loss" in specs:
        raise fail(codes.UNUSABLE_NAME, f"{type(model).__name__}'s input `loss` cannot be "
                   "checked under this name: `loss` is the name plans and the IR give the "
                   "step's loss (`split loss ...` would be a claim on it)", where,
                   help="rename the forward argument and its input_specs key")
    order = _forward_order(model, specs)
    if order is not None:
        raise fail(codes.BAD_INPUT_SPEC, f"{type(model).__name__}.input_specs lists the "
                   f"inputs as {', '.join(specs)}, forward takes them as {', '.join(order)}: "
                   f"they are passed in input_specs' order, so each would reach the other's "
                   f"parameter", where, help="list input_specs in forward's argument order "
                   "(docs/models.md)")
    return specs


def _forward_order(model: Any, specs: Any) -> list[str] | None:
    """Forward's parameter names when they are input_specs' names in another order (the
    inputs are passed by position), else ``None``."""
    import inspect

    try:
        params = list(inspect.signature(type(model).forward).parameters.values())[1:]
    except (TypeError, ValueError):
        return None
    positional = [p.name for p in params
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][:len(specs)]
    names = list(specs)
    return positional if sorted(positional) == sorted(names) and positional != names else None
