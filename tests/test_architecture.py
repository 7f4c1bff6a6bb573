"""The package's layering, read from the source: imports only go down the layers of
docs/architecture.md, modules form no import circle, and only the runtime starts processes."""

from __future__ import annotations

import ast
from pathlib import Path

import hetlab

SOURCE = Path(hetlab.__file__).parent

# Lowest first: a module may import its own layer and the layers before it. Layer names are
# module paths below `hetlab`; the longest matching prefix places a module.
LAYERS = [
    ["errors", "files", "dir_lock", "stop_signals", "seeds", "extras", "onnx_export", "devices", "cpu_isa", "checkpoint",
     "run_config", "run_history", "run_meta", "assets", "headless_gl", "figures", "measure"],
    ["sim"],
    ["tasks"],
    ["algos"],
    ["datasets", "policies"],
    ["runtime"],
    ["train"],
    ["deploy"],
    ["aloha", "aloha_config"],
    ["offload"],
    ["imitation"],
    ["cli", "__init__"],
]
PROCESS_STARTERS = {"Process", "Pool", "ProcessPoolExecutor"}  # multiprocessing's and concurrent.futures'
# What a training run does around its steps — stop on a signal, open and close its loggers, write a
# checkpoint and name its resume command — is called from the run layer alone.
RUN_LAYER = "train.run_layer"
RUN_LAYER_CALLS = {"stop_guard", "make_loggers", "close_loggers", "save_checkpoint", "resume_with"}
TRAINING_LOOPS = ("train.on_policy", "train.off_policy", "imitation.phase_a", "imitation.phase_b")


def module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


def layer_of(module: str) -> int:
    matches = [(len(prefix), index) for index, layer in enumerate(LAYERS) for prefix in layer
               if module == prefix or module.startswith(prefix + ".")]
    assert matches, f"hetlab.{module} is in no layer of LAYERS; add it"
    return max(matches)[1]


def hetlab_imports(tree: ast.Module, top_level_only: bool) -> set[str]:
    nodes = tree.body if top_level_only else ast.walk(tree)
    found = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hetlab."):
            package = node.module.removeprefix("hetlab.")
            for alias in node.names:  # `from hetlab.sim import mujoco_batch` imports a submodule
                submodule = SOURCE.joinpath(*package.split("."), f"{alias.name}.py")
                found.add(f"{package}.{alias.name}" if submodule.is_file() else package)
        elif isinstance(node, ast.Import):
            found.update(a.name.removeprefix("hetlab.") for a in node.names if a.name.startswith("hetlab."))
    return found


def modules() -> dict[str, ast.Module]:
    return {module_name(path): ast.parse(path.read_text()) for path in sorted(SOURCE.rglob("*.py"))}


def test_imports_only_go_down_the_layers():
    upward = []
    for module, tree in modules().items():
        for imported in hetlab_imports(tree, top_level_only=False):
            if layer_of(imported) > layer_of(module):
                upward.append(f"hetlab.{module} imports hetlab.{imported}")
    assert not upward, upward


def test_no_import_circle():
    graph = {module: {i for i in hetlab_imports(tree, top_level_only=True)} for module, tree in modules().items()}
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for imported in graph.get(module, ()):
            if state.get(imported) == "open":
                raise AssertionError("import circle: " + " → ".join(path[path.index(imported):] + [imported]))
            if imported not in state:
                visit(imported, path + [imported])
        state[module] = "done"

    for module in graph:
        if module not in state:
            visit(module, [module])


def calls(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of each call of a function or method named in `names`."""
    found = []
    for node in ast.walk(tree):
        called = node.func if isinstance(node, ast.Call) else None
        name = called.attr if isinstance(called, ast.Attribute) else getattr(called, "id", None)
        if name in names:
            found.append((node.lineno, name))
    return found


def test_only_the_runtime_starts_processes():
    starters = [f"hetlab.{module}:{line} calls {name}" for module, tree in modules().items()
                if not module.startswith("runtime") for line, name in calls(tree, PROCESS_STARTERS)]
    assert not starters, starters


def test_every_training_loop_stands_on_the_one_run_layer():
    """A new cross-cutting feature of a run touches train/run_layer.py alone: no loop stops on a
    signal, opens a logger or writes a checkpoint by itself, and each one uses the layer."""
    found = modules()
    elsewhere = [f"hetlab.{module}:{line} calls {name}" for module, tree in found.items() if module != RUN_LAYER
                 for line, name in calls(tree, RUN_LAYER_CALLS)]
    assert not elsewhere, elsewhere
    assert {name for _, name in calls(found[RUN_LAYER], RUN_LAYER_CALLS)} == RUN_LAYER_CALLS
    run_layer_users = {module for module, tree in found.items() if "train.run_layer" in hetlab_imports(tree, False)
                       or "train.run" in hetlab_imports(tree, False)}
    assert set(TRAINING_LOOPS) <= run_layer_users, set(TRAINING_LOOPS) - run_layer_users


def test_there_is_one_training_loop():
    """Every training runs the layer's `loop` with its own data source and update: none of them
    steps through its batches in a loop of its own."""
    found = modules()
    for module in TRAINING_LOOPS:
        assert [name for _, name in calls(found[module], {"loop"})] == ["loop"], module
        # A loop of its own would wait for data, update or go backwards inside a for or a while.
        own = [node.lineno for node in ast.walk(found[module]) if isinstance(node, (ast.While, ast.For))
               and calls(node, {"next_staged", "update", "backward"})]
        assert not own, f"hetlab.{module} steps through batches in a loop of its own at lines {own}"


def hand_typed_layouts(tree: ast.AST) -> list[int]:
    """Lines that assign a class's `obs_sizes` or a module's `*POLICY_NOISE` vector by hand."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) or (isinstance(node, ast.AnnAssign) and node.value is not None):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [target.id for target in targets if isinstance(target, ast.Name)]
            if any(name == "obs_sizes" or name.endswith("POLICY_NOISE") for name in names):
                lines.append(node.lineno)
    return sorted(lines)


def test_tasks_declare_their_observations_as_terms():
    """Observation sizes and noise vectors follow from a task's declared terms (tasks/observations.py);
    none is typed by hand."""
    typed = [f"hetlab.{module}:{line}" for module, tree in modules().items() if module.startswith("tasks.")
             for line in hand_typed_layouts(tree)]
    assert not typed, typed
    assert hand_typed_layouts(ast.parse("class T:\n    obs_sizes = {'policy': 3}\nPOLICY_NOISE = [0.1]\n")) == [2, 3]


def test_tasks_declare_their_rewards_as_terms():
    """Every task's reward is its `rewards` terms (tasks/terms.RewardTerm) and nothing else: the base
    class sums them, and no task computes or weighs a reward of its own."""
    from hetlab.tasks import TASKS, task_class
    from hetlab.tasks.terms import RewardTerm

    for name in TASKS:
        task = task_class(name)
        assert task.rewards and all(isinstance(term, RewardTerm) for term in task.rewards.values()), name
    own = [f"hetlab.{module}:{node.lineno} {node.name}" for module, tree in modules().items()
           if module.startswith("tasks.") and module != "tasks.base" for node in ast.walk(tree)
           if isinstance(node, ast.FunctionDef) and node.name.startswith(("_reward", "reward"))]
    assert not own, own


def test_the_checks_see_what_they_look_for():
    """The walkers find an upward import and a process start when there is one."""
    tree = ast.parse("import multiprocessing\nfrom hetlab.train.config import TrainConfig\n"
                     "def f():\n    multiprocessing.get_context('spawn').Process(target=f).start()\n")
    assert hetlab_imports(tree, top_level_only=True) == {"train.config"}
    assert layer_of("train.config") > layer_of("runtime.pool")
    assert calls(tree, PROCESS_STARTERS) == [(4, "Process")]
    assert calls(ast.parse("from hetlab.stop_signals import stop_guard\nwith stop_guard(): pass\n"),
                 RUN_LAYER_CALLS) == [(2, "stop_guard")]
