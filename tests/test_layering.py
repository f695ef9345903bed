"""fastconv's modules import each other without cycles (lazy imports inside functions
included): each layer uses the ones below it only, so a reader can follow a call down."""

import ast
import pathlib

import fastconv

SRC = pathlib.Path(fastconv.__file__).parent


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """module -> the fastconv modules it imports (at the top or inside functions)."""
    modules = {_module_name(p): p for p in SRC.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                target = (f"{base}.{node.module}" if node.module else base) if node.level \
                    else node.module or ""
                for alias in node.names:  # `from . import plans` names a module
                    sub = f"{target}.{alias.name}"
                    deps.add(sub if sub in modules else target)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
        graph[name] = {d for d in deps if d in modules and d != name and d != "fastconv"}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for d in sorted(graph[n]):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state and (found := visit(d)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


def test_the_modules_import_each_other_without_cycles():
    graph = _imports()
    assert {"fastconv.functional", "fastconv.plans", "fastconv.ops", "fastconv.dispatch",
            "fastconv.plancache", "fastconv.backends.cudnn"} <= set(graph)
    assert "fastconv.plans" in graph["fastconv.ops"]  # (the graph sees relative imports)
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_the_cycle_finder_finds_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_library_imports_no_tool():
    """Nothing outside fastconv.tools imports it (at the top or inside a function), but
    ``python -m fastconv``, which is the command line."""
    graph = _imports()
    for name, deps in graph.items():
        if not name.startswith("fastconv.tools") and name != "fastconv.__main__":
            tools = sorted(d for d in deps if d.startswith("fastconv.tools"))
            assert not tools, f"{name} imports {tools}"


def test_importing_fastconv_imports_neither_growth_nor_the_tools():
    import subprocess
    import sys

    code = ("import sys, fastconv\n"
            "print(sorted(m for m in sys.modules if m.startswith(('fastconv.growth', "
            "'fastconv.tools'))))\n"
            "fastconv.growth.grow_width\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]"
