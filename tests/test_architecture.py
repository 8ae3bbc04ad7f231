"""The design's rules, checked on the code itself: layers import downward only, one device policy,
one registry per kind of plugin, small modules."""

from __future__ import annotations

import ast
import re

import pytest

from conftest import REPO

# cluster (config types, storage, runtime) <- actors (workers) <- pipelines <- serve, view <- cli
LAYERS = {"errors": 0, "cluster": 1, "actors": 2, "pipelines": 3, "serve": 4, "view": 4, "cli": 5}
PACKAGES = ("cluster", "actors", "pipelines", "serve", "view", "cli")


def sources() -> list:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")) + [REPO / "errors.py"]


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(tree):  # imports inside functions count too
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("redline."):
            out += [(node.lineno, node.module)] + [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("redline.")]
    return out


def layer_of(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.get(parts[1]) if len(parts) > 1 else None


def test_layers_import_downward_only():
    upward = []
    for path in sources():
        own = layer_of("redline." + path.relative_to(REPO).parts[0].removesuffix(".py"))
        for line, module in imported_modules(ast.parse(path.read_text())):
            target = layer_of(module)
            if own is not None and target is not None and target > own:
                upward.append(f"{path.relative_to(REPO)}:{line} imports {module}")
    assert not upward, "upward imports:\n" + "\n".join(sorted(set(upward)))


def test_the_import_check_catches_an_upward_import(tmp_path):
    tree = ast.parse("def f():\n    from redline.pipelines.score import run_score\n")
    assert [layer_of(m) for _, m in imported_modules(tree)] == [3, 3]


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
