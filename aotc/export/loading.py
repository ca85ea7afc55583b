"""Import a user's model: a path to model.py, an import path "package.module:attr", or a saved
transformers model folder (model_folder.py).

In a file, unless --entry names it, the entry is found in this order: a function `get_model()`;
a module-level `model` that is an nn.Module; the single nn.Module subclass defined in the file,
built with no arguments. A plain function of tensors can be named with --entry: it is wrapped
in a module whose forward calls it.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from pathlib import Path

from aotc.errors import ModelError, UserInputError
from aotc.export.loaded_model import LoadedModel
from aotc.export.user_frames import first_line, innermost_user_frame


def _function_module(fn):
    import torch

    class FunctionModule(torch.nn.Module):
        """Wraps a plain function of tensors so torch.export sees a module."""

        def __init__(self, function):
            super().__init__()
            self.function = function

        def forward(self, *args):
            return self.function(*args)

    return FunctionModule(fn)


def load_model(target: str, entry: str | None = None, dtype: str | None = None) -> LoadedModel:
    """`dtype`: the model's dtype, for a model folder (default: its config's) or with --task."""
    if Path(target).is_dir():
        from aotc.export.model_folder import load_model_folder

        if entry:
            raise UserInputError(
                f"--entry names a model in a model file; {target} is a model folder: leave it out"
            )
        return load_model_folder(Path(target), dtype)
    loaded = _load_model_file(target, entry)
    if dtype is not None:
        import torch

        loaded.module.to(getattr(torch, dtype))
    return loaded


def _load_model_file(target: str, entry: str | None) -> LoadedModel:
    if ":" in target and not Path(target).exists():
        module_name, _, attr = target.partition(":")
        module = _import_module(module_name, target)
        return _from_attr(module, entry or attr, target, ())
    path = Path(target)
    if not path.exists():
        raise UserInputError(
            f"model file {target} does not exist; pass a path to model.py, a model folder "
            "(save_pretrained's) or an import path like package.module:attr"
        )
    if path.suffix != ".py":
        raise UserInputError(
            f"{target} is not a Python file; pass model.py, a model folder (save_pretrained's) "
            "or package.module:attr"
        )
    module = _import_file(path)
    files = (str(path.resolve()),)
    example_inputs = getattr(module, "example_inputs", None)
    if entry:
        loaded = _from_attr(module, entry, f"{target}:{entry}", files)
    else:
        loaded = _find_entry(module, path, files)
    loaded.example_inputs = example_inputs if callable(example_inputs) else None
    return loaded


def _import_module(module_name: str, target: str):
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise UserInputError(
            f"cannot import '{module_name}' from {target}: {exc}; install it or pass a file path"
        ) from None
    except Exception as exc:
        raise ModelError(
            f"importing {module_name} failed: {type(exc).__name__}: {first_line(exc)}"
        ) from exc


def _import_file(path: Path):
    name = f"aotc_user_model_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    # The user's folder goes first on sys.path so the model's own sibling imports resolve.
    sys.path.insert(0, str(path.resolve().parent))
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise ModelError(f"{exc.filename}:{exc.lineno}: syntax error: {exc.msg}") from None
    except Exception as exc:
        where = innermost_user_frame(exc, (str(path.resolve()),))
        raise ModelError(
            f"importing {path} failed at {where or path}: {type(exc).__name__}: {first_line(exc)}"
        ) from exc
    return module


def _is_module_class(obj, torch) -> bool:
    return inspect.isclass(obj) and issubclass(obj, torch.nn.Module)


def _find_entry(module, path: Path, files) -> LoadedModel:
    import torch

    if callable(getattr(module, "get_model", None)):
        return _from_attr(module, "get_model", f"{path}:get_model()", files)
    if isinstance(getattr(module, "model", None), torch.nn.Module):
        return _from_attr(module, "model", f"{path}:model", files)
    classes = [
        obj
        for obj in vars(module).values()
        if _is_module_class(obj, torch) and obj.__module__ == module.__name__
    ]
    if len(classes) == 1:
        return _from_attr(module, classes[0].__name__, f"{path}:{classes[0].__name__}", files)
    if not classes:
        functions = [
            n
            for n, obj in vars(module).items()
            if inspect.isfunction(obj) and obj.__module__ == module.__name__
        ]
        hint = (
            f"; to export a function of tensors pass --entry NAME (functions here: {', '.join(functions)})"
            if functions
            else ""
        )
        raise ModelError(
            f"{path} defines no model: add get_model(), a module-level `model`, or an nn.Module subclass{hint}"
        )
    names = ", ".join(sorted(c.__name__ for c in classes))
    raise UserInputError(
        f"{path} defines several nn.Module classes ({names}); pick one with --entry NAME"
    )


def _from_attr(module, attr: str, description: str, files) -> LoadedModel:
    import torch

    if not hasattr(module, attr):
        raise UserInputError(
            f"{description}: '{attr}' is not defined there; check --entry or the import path"
        )
    obj = getattr(module, attr)
    if isinstance(obj, torch.nn.Module):
        return LoadedModel(obj.eval(), description, files)
    if _is_module_class(obj, torch) or (callable(obj) and _required_params(obj) == 0):
        built = _construct(obj, description, files)
        if not isinstance(built, torch.nn.Module):
            raise ModelError(f"{description}() returned {type(built).__name__}, not an nn.Module")
        return LoadedModel(built.eval(), description, files)
    if callable(obj):
        return LoadedModel(_function_module(obj).eval(), description, files)
    raise UserInputError(
        f"{description} is a {type(obj).__name__}, not an nn.Module, a model factory or a function of tensors"
    )


def _required_params(fn) -> int:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 0
    return sum(
        1
        for p in params
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    )


def _construct(factory, description: str, files):
    import torch

    # A fixed seed makes randomly initialised models (no --weights) the same in every export,
    # so an artifact can be rebuilt and compared with a fresh eager copy of the model.
    torch.manual_seed(0)
    try:
        return factory()
    except Exception as exc:
        where = innermost_user_frame(exc, files)
        at = f" at {where}" if where else ""
        raise ModelError(
            f"building the model {description} failed{at}: {type(exc).__name__}: {first_line(exc)}; "
            "fix the constructor or pass --entry"
        ) from exc
