"""The library's dependencies point one way, and it installs under one namespace.

The layers (ARCHITECTURE.md): `slimeish.common` at the bottom; the parts on it, none importing
another except the router, which stores turns through the buffer's public API; the built-in
plugins on the plugin contracts; the orchestration (train loop, launcher, producer, CLI) on top,
and nothing below it imports a plugin.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# part -> the other parts it may import. A name ending in "!" may be imported only as that exact
# module (a package's public API in its __init__), not its submodules.
ALLOWED: dict[str, set[str]] = {
    "slimeish.common": set(),
    "slimeish.buffer": {"slimeish.common"},
    "slimeish.engine": {"slimeish.common"},
    "slimeish.models": {"slimeish.common"},
    "slimeish.trainer": {"slimeish.common"},
    "slimeish.data": {"slimeish.common"},
    "slimeish.rollout": {"slimeish.common", "slimeish.utils"},  # slime's sft_rollout on slime's helpers
    "slimeish.utils": {"slimeish.common"},  # slime's helper paths for plugins
    "slimeish.backends": {"slimeish.common", "slimeish.trainer"},  # slime's loss-helper paths for loss plugins
    "slimeish.router": {"slimeish.common", "slimeish.buffer!"},
    "slimeish.rollout_functions": {"slimeish.common", "slimeish.rollout", "slimeish.data"},
    "slimeish.viewer": {"slimeish.common", "slimeish.buffer!"},  # reads the buffer through its public API
}
ORCHESTRATION = (
    "slimeish.train",
    "slimeish.cluster",
    "slimeish.cli",
    "slimeish.cli_docs",
    "slimeish.__main__",
    "slimeish",
)
PARTS = sorted(ALLOWED, key=len, reverse=True)


SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def library_modules() -> dict[str, Path]:
    """Module name -> file, through pyproject's package-dir mapping (the installed names)."""
    mapping = SETUPTOOLS["package-dir"]
    modules = {}
    for package, folder in mapping.items():
        for path in (ROOT / folder).glob("*.py"):
            if package == "slimeish" or path.parent == ROOT / folder:
                modules[_name(package, ROOT / folder, path)] = path
        if package == "slimeish":  # its own subpackages that are folders inside it
            for path in (ROOT / folder).glob("*/**/*.py"):
                modules[_name(package, ROOT / folder, path)] = path
    return modules


def _name(package: str, folder: Path, path: Path) -> str:
    parts = [package, *path.relative_to(folder).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """Every slimeish module `path` imports, at any depth of the file (lazy imports count);
    `from package import name` imports the submodule `package.name` where there is one."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            submodules = {f"{node.module}.{a.name}" for a in node.names} & modules
            found |= submodules or {node.module}
    return {name for name in found if name == "slimeish" or name.startswith("slimeish.")}


def part_of(module: str) -> str | None:
    return next((p for p in PARTS if module == p or module.startswith(p + ".")), None)


def may_import(part: str, target: str) -> bool:
    target_part = part_of(target)
    if target_part is None or target_part == part:
        return True  # a package's own modules; `slimeish` itself (the namespace)
    allowed = ALLOWED[part]
    return target_part in allowed or f"{target}!" in allowed


def test_every_package_is_installed():
    """pyproject lists the packages (package-dir rules out discovery): a new one must be added."""
    packages = {m for m, path in library_modules().items() if path.name == "__init__.py"}
    assert packages == set(SETUPTOOLS["packages"])


def test_every_module_belongs_to_a_layer():
    strays = [m for m in library_modules() if part_of(m) is None and not m.startswith(ORCHESTRATION)]
    assert not strays, f"modules outside every layer of ALLOWED/ORCHESTRATION: {strays}"


def test_dependencies_point_one_way():
    bad = []
    modules = library_modules()
    for module, path in modules.items():
        part = part_of(module)
        for target in imports_of(path, set(modules)):
            if part is not None and not may_import(part, target):
                bad.append(f"{module} imports {target}")
            if part is None and part_of(target) == "slimeish.rollout_functions":
                bad.append(f"{module} imports the plugin {target}")
    assert not bad, "imports against the layers:\n" + "\n".join(sorted(bad))


def test_the_layer_check_catches_a_violation():
    assert not may_import("slimeish.buffer", "slimeish.router.server")
    assert not may_import("slimeish.router", "slimeish.buffer.client")
    assert may_import("slimeish.router", "slimeish.buffer")
    assert not may_import("slimeish.trainer", "slimeish.rollout_functions.token_in")


def test_installed_names_live_under_slimeish(tmp_path):
    """Outside the repository, only the namespaced names import: installing slimeish claims no
    generic top-level package."""
    for name in ("router", "buffer", "rollout_functions"):
        gone = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=tmp_path, capture_output=True, text=True)
        assert gone.returncode != 0 and "ModuleNotFoundError" in gone.stderr, name
    code = "import slimeish.router.server, slimeish.buffer.client, slimeish.rollout_functions.token_in"
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True)
