"""Optional dependencies: import one, or stop with one line naming the pip extra that installs it.

aotc itself needs torch, click and pyyaml; some features need more, listed as extras in
pyproject.toml ([project.optional-dependencies]): `aotc bench --plot` needs matplotlib (`aotc[bench]`).
A missing one is the user's setup, not a bug in aotc: UserInputError, exit 2, and the install command.
"""

from __future__ import annotations

import importlib

from aotc.errors import UserInputError


def require(module: str, extra: str, purpose: str):
    """Import and return `module`, or raise UserInputError saying that `purpose` needs it and how to install it.

    require("matplotlib", "bench", "--plot")
    -> "--plot needs matplotlib, which is not installed; pip install 'aotc[bench]'"
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        install = f"pip install 'aotc[{extra}]'"
        # exc.name is the module that was not found: this one (or its parent), or one of its own imports.
        if exc.name is None or exc.name == module or module.startswith(f"{exc.name}."):
            raise UserInputError(
                f"{purpose} needs {module}, which is not installed; {install}"
            ) from None
        raise UserInputError(
            f"{purpose} needs {module}, which is installed but fails to import ({exc}); "
            f"reinstall it: {install} --force-reinstall"
        ) from None
