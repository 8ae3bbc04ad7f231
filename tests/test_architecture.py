"""The design's rules, checked on the code itself: layers import downward only, no import circles,
packages used through their faces (`__all__`), one device policy, small modules."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from conftest import REPO

# cluster (config types, storage, runtime) <- actors (workers) <- pipelines <- serve, view <- cli <- bench
LAYERS = {"errors": 0, "cluster": 1, "actors": 2, "pipelines": 3, "serve": 4, "view": 4, "cli": 5, "bench": 6}
PACKAGES = ("cluster", "actors", "pipelines", "serve", "view", "cli")
# Dynamic imports whose module is not a literal: allowed only here, and why.
DYNAMIC_IMPORTS = {
    "pipelines/registry.py": "imports the pipeline modules named in ENTRIES (each a string, checked as an import)",
    "actors/attack/resources.py": "imports whichever spaCy English model package is installed",
}
MODULE_NAME = re.compile(r"^redline(\.[A-Za-z_]\w*)+$")


def sources(root: Path = REPO, bench: bool = False) -> list[Path]:
    """The package's modules (and, with `bench`, the bench scripts that use it)."""
    return sorted([p for pkg in (*PACKAGES, *(("bench",) if bench else ())) for p in (root / pkg).glob("**/*.py")
                   if not _hidden(p, root)] + [root / "errors.py"])


def _hidden(path: Path, root: Path) -> bool:
    """Under a hidden folder: a virtual environment or a tool's work (.venv, bench/.textattack-venv, .mutmut-*)."""
    return any(part.startswith(".") for part in path.relative_to(root).parts)


def module_of(root: Path, path: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(("redline", *parts))


def imported_modules(tree: ast.AST, here: str = "redline", is_package: bool = False) -> list[tuple[int, str]]:
    """(line, dotted name) of every redline module or name this code reaches: `import`, `from`
    (relative ones resolved from `here`), importlib.import_module / __import__ with a literal, and any
    string that names a redline module (a registry's module path). Imports inside functions count."""
    out = []
    package = here.split(".") if is_package else here.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.startswith("redline"):
                out += [(node.lineno, module)] + [(node.lineno, f"{module}.{a.name}") for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("redline.")]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_NAME.match(node.value):
            out.append((node.lineno, node.value))
    return out


def dynamic_imports(tree: ast.AST) -> list[int]:
    """Lines of importlib.import_module / __import__ calls whose module is not a literal."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and not isinstance(node.args[0], ast.Constant):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in ("import_module", "__import__"):
                lines.append(node.lineno)
    return lines


def layer_of(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.get(parts[1]) if len(parts) > 1 else None


def violations(root: Path = REPO) -> list[str]:
    """Every import that breaks the layering: upward, sideways (another package of the same layer),
    an underscored name of another package (bench counts as outside every package), or a dynamic
    import the rules cannot see."""
    found = []
    for path in sources(root, bench=True):
        if not path.exists():
            continue
        rel = path.relative_to(root)
        here = module_of(root, path)
        own_pkg = here.split(".")[1]
        own = LAYERS.get(own_pkg)
        tree = ast.parse(path.read_text())
        home = here if path.name == "__init__.py" else here.rsplit(".", 1)[0]
        for line, module in imported_modules(tree, here, path.name == "__init__.py"):
            parts = module.split(".")
            private = next((i for i, part in enumerate(parts) if part.startswith("_") and part != "__init__"), None)
            if private is not None:
                # the package that owns the name: the one named before it, or the package of that module
                named = parts[:private]
                owner = ".".join(named if root.joinpath(*named[1:]).is_dir() else named[:-1])
                if not (home == owner or home.startswith(owner + ".")):
                    found.append(f"{rel}:{line} imports {module} (a private name of another package)")
            target_pkg = parts[1] if len(parts) > 1 else None
            target = layer_of(module)
            if own is None or target is None or target_pkg == own_pkg:
                continue
            if target > own:
                found.append(f"{rel}:{line} imports {module} (upward)")
            elif target == own:
                found.append(f"{rel}:{line} imports {module} (sideways: {own_pkg} and {target_pkg} are one layer)")
        if str(rel) not in DYNAMIC_IMPORTS:
            found += [f"{rel}:{line} imports a module named at run time (not checkable)" for line in dynamic_imports(tree)]
    return sorted(set(found))


def test_layers_import_downward_only():
    found = violations()
    assert not found, "import rule broken:\n" + "\n".join(found)


# Inside pipelines/: a pipeline module -> plane/ (the data plane) -> reporting/ (figures, the report page).
PIPELINE_FLOORS = {"reporting": 0, "plane": 1}  # any other module of pipelines/ is a pipeline: floor 2


def pipeline_floor(module: str) -> int | None:
    parts = module.split(".")
    if parts[:2] != ["redline", "pipelines"] or len(parts) < 3:
        return None
    return PIPELINE_FLOORS.get(parts[2], 2)


def pipelines_upward(root: Path = REPO) -> list[str]:
    """Imports inside pipelines/ that go up a floor: reporting/ importing the plane or a pipeline, the
    plane importing a pipeline (the pipelines package's own __init__ counts as no floor)."""
    found = []
    for path in sorted((root / "pipelines").glob("**/*.py")):
        if _hidden(path, root) or path == root / "pipelines" / "__init__.py":
            continue
        here = module_of(root, path)
        own = pipeline_floor(here)
        for line, module in imported_modules(ast.parse(path.read_text()), here, path.name == "__init__.py"):
            target = pipeline_floor(module)
            if module in ("redline.pipelines", "redline.pipelines.plane", "redline.pipelines.reporting"):
                continue  # a package named in `from redline.pipelines.x import y`: its y is checked
            if own is not None and target is not None and target > own:
                found.append(f"{path.relative_to(root)}:{line} imports {module} (up a floor inside pipelines/)")
    return found


def test_inside_pipelines_imports_go_down_a_pipeline_the_plane_then_reporting(tmp_path):
    found = pipelines_upward()
    assert not found, "\n".join(found)
    for folder in ("pipelines", "pipelines/plane", "pipelines/reporting"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "__init__.py").write_text("")
    planted = {"pipelines/reporting/up.py": "from redline.pipelines.plane import sharded\n",
               "pipelines/reporting/late.py": "def f():\n    from redline.pipelines import score\n",
               "pipelines/plane/up.py": "from redline.pipelines.score import ScoreConfig\n"}
    fine = {"pipelines/score.py": "from redline.pipelines.plane import sharded\nfrom redline.pipelines.reporting import figures\n",
            "pipelines/plane/down.py": "from redline.pipelines.reporting import aggregates as A\nfrom . import sharded\n"}
    for rel, code in {**planted, **fine}.items():
        (tmp_path / rel).write_text(code)
    assert sorted({f.split(":")[0] for f in pipelines_upward(tmp_path)}) == sorted(planted)


def test_the_import_check_catches_every_planted_violation(tmp_path):
    """The checker itself, on a copy of the layout with one violation of each kind planted."""
    for pkg in (*PACKAGES, "bench"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "errors.py").write_text("")
    planted = {
        "actors/relative.py": "from ..pipelines import score\n",
        "actors/dynamic.py": "import importlib\nimportlib.import_module('redline.serve.app')\n",
        "actors/dunder.py": "def f():\n    return __import__('redline.cli')\n",
        "actors/named.py": "name = 'redline.pipelines.score'\n",
        "actors/hidden.py": "import importlib\ndef f(n):\n    return importlib.import_module(n)\n",
        "serve/sideways.py": "from redline.view.app import build\n",
        "bench/private.py": "from redline.pipelines.plane.sharded import _merge\n",
        "cli/private.py": "from redline.cluster._secret import x\n",
        "cluster/inner.py": "def f():\n    from redline.actors import detectors\n",
        "actors/sibling.py": "from redline.actors.attack.search import _best\n",
    }
    for rel, code in planted.items():
        (tmp_path / rel).write_text(code)
    (tmp_path / "actors" / "attack").mkdir()
    (tmp_path / "actors" / "attack" / "fine.py").write_text(
        "from . import search\nfrom redline.cluster import storage\nfrom redline.actors.attack.search import _best\n"
        "from redline.actors.attack._impl import helper\n")
    found = violations(tmp_path)
    assert sorted({line.split(":")[0] for line in found}) == sorted(planted), found
    assert any("(upward)" in f and f.startswith("actors/relative.py") for f in found)
    assert any("(sideways" in f for f in found) and any("private name" in f for f in found)
    assert any("named at run time" in f for f in found)


def load_time_imports(root: Path = REPO) -> dict[str, set[str]]:
    """Each module's redline modules imported when it loads: module-level `import`/`from` (outside
    `if TYPE_CHECKING:`), a name resolved to its module where it is one, else to the module it is
    in. Imports inside functions run later and cannot make a circle at load time."""
    modules = {module_of(root, p): p for p in sources(root)}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        top = [n for n in tree.body if not (isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test))]
        found = set()
        for node in top:
            for line, module in imported_modules(node, name, path.name == "__init__.py"):
                if isinstance(node, (ast.Import, ast.ImportFrom, ast.Try, ast.If)):
                    found.add(module if module in modules else module.rsplit(".", 1)[0])
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected parts of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while not part or part[-1] != v:
                part.append(stack.pop())
            if len(part) > 1:
                circles.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_no_module_imports_itself_round_a_circle():
    circles = import_circles(load_time_imports())
    assert not circles, "import circles (module-level imports):\n" + "\n".join(" -> ".join(c) for c in circles)


def test_the_circle_check_finds_a_planted_circle(tmp_path):
    for pkg in PACKAGES:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "errors.py").write_text("")
    (tmp_path / "actors" / "a.py").write_text("from redline.actors import b\n")
    (tmp_path / "actors" / "b.py").write_text("from redline.actors.c import thing\n")
    (tmp_path / "actors" / "c.py").write_text("from typing import TYPE_CHECKING\nfrom redline.actors.a import x\n"
                                             "thing = 1\n")
    (tmp_path / "actors" / "late.py").write_text("def f():\n    from redline.actors import a\n")
    (tmp_path / "actors" / "typed.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                                 "    from redline.actors import late\n")
    assert import_circles(load_time_imports(tmp_path)) == [["redline.actors.a", "redline.actors.b", "redline.actors.c"]]


def public_faces(root: Path = REPO) -> dict[str, set[str]]:
    """Each package's `__all__` (its modules and names other packages may import)."""
    faces = {}
    for init in root.glob("**/__init__.py"):
        if _hidden(init, root) or "tests" in init.parts:
            continue
        tree = ast.parse(init.read_text())
        names = next((ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                      and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)), None)
        faces[module_of(root, init)] = set(names) if names is not None else None
    return faces


def test_every_package_says_what_it_offers_and_others_use_only_that():
    faces = public_faces()
    missing = sorted(pkg for pkg, names in faces.items() if names is None and pkg not in ("redline", "redline.cli"))
    assert not missing, f"packages without __all__: {missing}"
    for pkg, names in faces.items():
        folder = REPO.joinpath(*pkg.split(".")[1:])
        defined = {n for n in names or ()
                   if (folder / f"{n}.py").exists() or (folder / n / "__init__.py").exists()
                   or re.search(rf"\b{n}\b", (folder / "__init__.py").read_text().split("__all__")[0])}
        assert defined == set(names or ()), f"{pkg}.__all__ names what it lacks: {sorted(set(names) - defined)}"
    outside = [f"{path.relative_to(REPO)}:{line} imports {module}, not in {pkg}.__all__"
               for path, line, module, pkg, name in imports_from_outside(faces)
               if faces[pkg] is not None and name not in faces[pkg]]
    assert not outside, "\n".join(sorted(set(outside)))


def imports_from_outside(faces: dict[str, set[str] | None]) -> list[tuple[Path, int, str, str, str]]:
    """(file, line, module, package, the name taken from the package's face) of every import of a
    package's module or name from outside that package (its other modules and the bench scripts)."""
    found = []
    for path in sources(bench=True):
        here = module_of(REPO, path)
        home = here if path.name == "__init__.py" else here.rsplit(".", 1)[0]
        for line, module in imported_modules(ast.parse(path.read_text()), here, path.name == "__init__.py"):
            parts = module.split(".")
            pkg = next((".".join(parts[:k]) for k in range(len(parts) - 1, 1, -1) if ".".join(parts[:k]) in faces),
                       None)
            if pkg is not None and not (home == pkg or home.startswith(pkg + ".")):
                found.append((path, line, module, pkg, parts[len(pkg.split("."))]))
    return found


# Names a face offers that no package of redline imports, and why: the plugin API (a detector kind or
# chat-model provider from outside redline is written against these) and the console script's entry.
FACE_EXTRAS = {
    "redline.actors.detectors": {"DecisionRule": "a plugin detector's `rule`", "register_detector": "plugin API"},
    "redline.actors.providers": {"ChatProvider": "a plugin provider's base class", "Answer": "what it returns",
                                 "Transient": "the failure it raises to be retried", "register_provider": "plugin API"},
    "redline.cli": {"app": "the typer app (`python -m redline`, scripts that add commands)"},
}


def test_a_face_offers_only_what_other_packages_use():
    """A package's face is what the other layers (and the bench) import, plus the plugin API named in
    FACE_EXTRAS: a name nothing outside uses is an inside detail, not part of the face."""
    faces = public_faces()
    used: dict[str, set[str]] = {pkg: set() for pkg in faces}
    for _, _, _, pkg, name in imports_from_outside(faces):
        used[pkg].add(name)
    unused = {pkg: sorted(set(names) - used[pkg] - set(FACE_EXTRAS.get(pkg, {})))
              for pkg, names in faces.items() if names and set(names) - used[pkg] - set(FACE_EXTRAS.get(pkg, {}))}
    assert not unused, f"faces offer what no other package imports (drop them, or name plugin API in " \
                       f"FACE_EXTRAS): {unused}"
    stale = {pkg: sorted(set(extras) - faces.get(pkg, set())) for pkg, extras in FACE_EXTRAS.items()}
    assert not {pkg: names for pkg, names in stale.items() if names}, f"FACE_EXTRAS names what no face offers: {stale}"


def test_every_model_goes_through_the_device_policy():
    """Only cluster/devices.py asks torch about CUDA; nobody else picks a device for a model."""
    offenders = []
    for path in sources():
        if path.name == "devices.py":
            continue
        text = path.read_text()
        for pattern in (r"cuda\.is_available\(\)", r"""["']cuda["']""", r"device_map="):
            for m in re.finditer(pattern, text):
                offenders.append(f"{path.relative_to(REPO)}:{text[:m.start()].count(chr(10)) + 1}: {m.group(0)}")
    assert not offenders, "device choices outside the device policy:\n" + "\n".join(offenders)


def test_no_module_over_500_lines():
    long = [f"{p.relative_to(REPO)} ({n} lines)" for p in sources()
            if (n := len(p.read_text().splitlines())) > 500]
    assert not long, long


def test_device_policy():
    from redline.cluster import devices
    from redline.errors import RedlineError

    assert devices.placement(0) == devices.Placement("cpu", "float32")
    assert devices.placement(0, "float64") == devices.Placement("cpu", "float64")
    assert devices.placement(0, "float16") == devices.Placement("cpu", "float32")  # no fast fp16 on CPUs
    bf16 = devices.placement(0, "bfloat16", training=True)
    if devices.cpu_native_bf16():
        assert bf16 == devices.Placement("cpu", "float32", "bfloat16")  # fp32 master weights, bf16 forward
    else:
        assert bf16 == devices.Placement("cpu", "float32")  # refused: tens of times slower without AVX512-BF16/AMX
    with pytest.raises(RedlineError, match="unknown precision 'fp8'"):
        devices.placement(0, "fp8")
    import torch

    if not torch.cuda.is_available():  # a GPU reservation the machine cannot honour is named, not ignored
        with pytest.raises(RedlineError, match="num_gpus=1 but torch sees no CUDA device"):
            devices.placement(1)


def test_bf16_falls_back_where_the_cpu_lacks_it(monkeypatch, caplog):
    from redline.cluster import devices

    monkeypatch.setattr(devices, "cpu_native_bf16", lambda: False)
    with caplog.at_level("WARNING"):
        assert devices.placement(0, "bfloat16") == devices.Placement("cpu", "float32")
    monkeypatch.setattr(devices, "cpu_native_bf16", lambda: True)
    assert devices.placement(0, "bfloat16") == devices.Placement("cpu", "bfloat16")


def test_one_registry_type_holds_every_kind_of_plugin():
    """Detector kinds, providers, attack components and pipelines are each a `cluster.plugins.Registry`:
    built-ins load on first use, an unknown name is one line listing the known ones, and a second
    plugin under a taken name fails where it is defined."""
    from redline.actors.attack.components import COMPONENTS
    from redline.actors.detectors.registry import DETECTORS
    from redline.actors.providers.registry import PROVIDERS
    from redline.cluster.plugins import Registry
    from redline.errors import RedlineError
    from redline.pipelines.registry import PIPELINES

    for registry in (DETECTORS, PROVIDERS, PIPELINES, *COMPONENTS.values()):
        assert isinstance(registry, Registry) and registry.all(), registry.what
    assert "hf" in DETECTORS and "openai" in PROVIDERS and "score" in PIPELINES and "greedy-wir" in COMPONENTS["search"]
    with pytest.raises(RedlineError, match=r"unknown detector kind 'nope' \(known: .*profanity-check"):
        DETECTORS.get("nope")

    loads = []
    fresh: Registry[type] = Registry("widget", lambda cls: cls.kind, lambda: loads.append(1) or ())
    assert not loads  # nothing imported until the registry is asked
    Widget = type("Widget", (), {"kind": "w"})
    assert fresh.register(Widget) is Widget and fresh.get("w") is Widget and loads == [1]
    fresh.register(Widget)  # the same class again (a module imported twice) is no conflict
    with pytest.raises(ValueError, match="two widgets named 'w'"):
        fresh.register(type("Other", (), {"kind": "w"}))
