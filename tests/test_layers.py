"""The package's layering: no module imports a module of a higher layer, and no import cycles.

Layers, highest first: cli > reproductions > audit > training / data / models / plotting >
mechanisms / accounting.  ``dpnoise.checks``, ``dpnoise.errors``, ``dpnoise.formatting`` and ``dpnoise.prepared`` are utilities that any
module may import.  Every import is found by parsing the source with ``ast``, including imports inside
functions and under ``TYPE_CHECKING`` (torch-free modules import their heavy neighbours lazily,
and those imports count too).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "dpnoise"

#: layer of each part of the package (the first name below ``dpnoise``); higher imports lower
LAYERS = {
    "accounting": 1, "mechanisms": 1, "layers": 1,
    "training": 2, "data": 2, "models": 2, "plotting": 2,
    "audit": 3, "huggingface": 3,
    "reproductions": 4,
    "cli": 5, "__main__": 5,
}
#: importable from any layer; they import nothing above the accounting layer themselves
UTILITIES = {"errors": 0, "formatting": 0, "prepared": 0, "checks": 1}
#: imports that break the rule today, each with the reason it is tolerated: (importer, imported part)
KNOWN_EXCEPTIONS: set[tuple[str, str]] = set()


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def source_modules(root: Path, top: str) -> dict[str, Path]:
    """``{dotted module name: file}`` of every module below ``root / top``."""
    return {module_name(path, root): path for path in sorted((root / top).rglob("*.py"))}


def imported_modules(path: Path, name: str, known: set[str]) -> list[tuple[str, int]]:
    """(module, line) of every import in ``path``; ``from a import b`` counts as ``a.b`` when that is
    a module, and relative imports are resolved against ``name``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.append((candidate if candidate in known else base, node.lineno))
    return found


def part(module: str) -> str:
    """``dpnoise.training.engine`` -> ``training``; ``reproductions.runner`` -> ``reproductions``."""
    names = module.split(".")
    if names[0] == "reproductions":
        return "reproductions"
    return names[1] if len(names) > 1 else "dpnoise"


def layer(name: str) -> int:
    return LAYERS.get(name, UTILITIES.get(name, -1))


@pytest.fixture(scope="module")
def package_imports() -> list[tuple[str, str, int]]:
    """(importer, imported dpnoise/reproductions module, line) for every module of src/dpnoise."""
    modules = source_modules(PACKAGE.parent, "dpnoise")
    known = set(modules) | set(source_modules(ROOT, "reproductions"))
    return [(name, imported, line) for name, path in modules.items()
            for imported, line in imported_modules(path, name, known)
            if imported.split(".")[0] in ("dpnoise", "reproductions")]


def test_every_part_of_the_package_has_a_layer():
    parts = {part(name) for name in source_modules(PACKAGE.parent, "dpnoise")} - {"dpnoise"}
    assert not [p for p in parts if layer(p) < 0], "add the new part of the package to LAYERS"


def test_no_module_imports_a_higher_layer(package_imports):
    upward = []
    for importer, imported, line in package_imports:
        low, high = part(importer), part(imported)
        if high in UTILITIES or high == "dpnoise" or low == high or (low, high) in KNOWN_EXCEPTIONS:
            continue
        if layer(high) > layer(low):
            upward.append(f"{importer}:{line} imports {imported} ({high} is above {low})")
    assert upward == []


def test_nothing_in_the_package_imports_reproductions(package_imports):
    assert [f"{i}:{line}" for i, imported, line in package_imports if part(imported) == "reproductions"] == []


def test_reproductions_import_no_command_line():
    modules = source_modules(ROOT, "reproductions")
    known = set(modules) | set(source_modules(PACKAGE.parent, "dpnoise"))
    found = [f"{name}:{line} imports {imported}" for name, path in modules.items()
             for imported, line in imported_modules(path, name, known)
             if imported == "dpnoise.cli" or imported.startswith(("dpnoise.cli.", "dpnoise.__main__"))]
    assert found == []


def test_no_import_cycles_between_parts(package_imports):
    """Between parts of one layer (data and models, say) imports go one way only."""
    edges: dict[str, set[str]] = {}
    for importer, imported, _ in package_imports:
        low, high = part(importer), part(imported)
        if low != high and "dpnoise" not in (low, high) and (low, high) not in KNOWN_EXCEPTIONS:
            edges.setdefault(low, set()).add(high)

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt}))
                   for nxt in edges.get(start, ()))

    assert sorted(f"{a} <-> {b}" for a in edges for b in edges[a] if reaches(b, a, {b})) == []


def test_no_import_cycles_between_modules():
    """No module imports, even inside a function, a module that imports it back (directly or through
    others): packages' ``__init__`` files, which gather their modules' names, left aside."""
    modules = {name: path for name, path in source_modules(PACKAGE.parent, "dpnoise").items()
               if path.name != "__init__.py"}
    edges = {name: {imported for imported, _ in imported_modules(path, name, set(modules))
                    if imported in modules and imported != name}
             for name, path in modules.items()}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt}))
                   for nxt in edges[start])

    assert sorted(f"{a} <-> {b}" for a in edges for b in edges[a] if reaches(b, a, {b})) == []


def test_the_rule_is_checked_on_real_imports(package_imports):
    """Guards the parser: imports known to exist are found, function-level ones included."""
    pairs = {(importer, imported) for importer, imported, _ in package_imports}
    assert ("dpnoise.cli.train", "dpnoise.training") in pairs  # inside run()
    assert ("dpnoise.training.preparation", "dpnoise.data") in pairs  # inside functions
    assert ("dpnoise.training.engine", "dpnoise.accounting") in pairs  # module level
    assert ("dpnoise.checks", "dpnoise.accounting.validation") in pairs  # inside a function
