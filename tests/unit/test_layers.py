"""app/ imports only downward: every import is checked against the `layers:` line of docs/ARCHITECTURE.md.

The line lists packages lowest first (`a < b, c < d`; a comma joins packages of equal rank). A module belongs
to the longest listed package that contains it. Imports under `if TYPE_CHECKING:` and inside functions count.
The same walk checks that no module imports a dependency's private module or assigns to its private attributes.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "app"


def layer_ranks() -> dict[str, int]:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    line = re.search(r"^layers: (.+)$", text, re.MULTILINE)
    assert line, "docs/ARCHITECTURE.md has no `layers:` line"
    return {package.strip(): rank for rank, group in enumerate(line[1].split("<")) for package in group.split(",")}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str, ranks: dict[str, int]) -> str:
    owners = [package for package in ranks if module == package or module.startswith(package + ".")]
    assert owners, f"{module} is in no layer of docs/ARCHITECTURE.md"
    return max(owners, key=len)


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in the file, relative imports resolved."""
    tree = ast.parse(path.read_text(), str(path))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def app_files() -> list[Path]:
    return sorted(APP.rglob("*.py"))


def test_the_layers_line_names_existing_packages():
    for package in layer_ranks():
        assert (ROOT / Path(*package.split("."))).exists(), f"{package} (docs/ARCHITECTURE.md) does not exist"


def test_no_module_imports_from_a_layer_above_it():
    ranks = layer_ranks()
    upward = []
    for path in app_files():
        source = layer_of(module_name(path), ranks)
        for line, target in imported_modules(path):
            if target == "app" or not target.startswith("app."):
                continue
            destination = layer_of(target, ranks)
            if ranks[destination] > ranks[source]:
                upward.append(f"{path.relative_to(ROOT)}:{line} ({source}) imports {target} ({destination})")
    assert not upward, "\n".join(upward)


def test_no_private_module_or_attribute_of_a_dependency_is_used():
    private = []
    for path in app_files():
        for line, target in imported_modules(path):
            if not target.startswith(("app", "__future__")) and any(p.startswith("_") for p in target.split(".")):
                private.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else []
            for target in targets:
                if (
                    isinstance(target, ast.Attribute)
                    and target.attr.startswith("_")
                    and not target.attr.startswith("__")
                    and not (isinstance(target.value, ast.Name) and target.value.id in ("self", "cls"))
                ):
                    private.append(f"{path.relative_to(ROOT)}:{node.lineno} assigns {ast.unparse(target)}")
    assert not private, "\n".join(private)
