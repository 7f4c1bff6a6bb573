"""`hetlab … --help`: every command's options described in plain notation, and the help built without
torch, MuJoCo or numpy."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import tyro

from hetlab.algos import ALGO_CONFIGS
from hetlab.cli import every_command, main
from hetlab.cli.parsing import OPTION_RULES, Group
from hetlab.cli.train import train_command

HETLAB = str(Path(sys.executable).with_name("hetlab"))
HEAVY = ("torch", "mujoco", "numpy", "onnxruntime", "openvino")


def command_lines(prefix: list[str], target) -> list[list[str]]:
    """`prefix` and the command line of every command under it, groups included."""
    lines = [prefix]
    if isinstance(target, Group):
        for name, sub in target.commands.items():
            lines += command_lines([*prefix, name], sub)
    return lines


# Every command line with a help of its own: `hetlab`, the groups, the commands, and `hetlab train`
# once per algorithm (it shows the chosen algorithm's options only).
EVERY_COMMAND = command_lines([], every_command()) + [["train", "--algo", algo] for algo in ALGO_CONFIGS]


def help_of(args: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main([*args, "--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


def test_the_walk_reaches_every_command():
    listed = {" ".join(line) for line in EVERY_COMMAND}
    assert {"", "train", "export", "play", "bench sim", "aloha train", "aloha eval", "offload study",
            "offload devices", "train --algo flashsac"} <= listed


@pytest.mark.parametrize("line", EVERY_COMMAND, ids=lambda line: " ".join(line) or "hetlab")
def test_every_help_lists_plain_metavars(line, capsys):
    text = help_of(line, capsys)
    prog = ["hetlab", *(["train"] if line[:1] == ["train"] else line)]
    assert text.startswith(f"usage: {' '.join(prog)} ")
    assert "{None}" not in text


def test_every_option_of_every_command_says_what_it_does():
    leaves = {" ".join(line): leaf for line in EVERY_COMMAND if callable(leaf := _target(line))}
    assert len(leaves) > 15
    bare, braced = [], []
    for name, function in leaves.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # get_parser: the parser tyro would build
            parser = tyro.extras.get_parser(function, registry=OPTION_RULES)
        assert parser.description, f"hetlab {name} has no description"
        for action in parser._actions:
            flag = action.option_strings[0] if action.option_strings else action.dest
            if flag == "-h":
                continue
            # tyro appends the default; an option that says nothing else has no description.
            text = re.sub(r"\((default|fixed to): .*\)$|\(required\)$", "", (action.help or "").strip()).strip()
            if not text:
                bare.append(f"hetlab {name} {flag}")
            if "{None}" in str(action.metavar):
                braced.append(f"hetlab {name} {flag} {action.metavar}")
    assert not bare, bare
    assert not braced, braced


def _target(line: list[str]):
    """The command function or Group that `hetlab LINE` reaches."""
    if line[:1] == ["train"]:
        return train_command(line[1:])
    target = every_command()
    for name in line:
        target = target.commands[name]
    return target


def test_an_option_left_unset_still_takes_none_where_none_means_something():
    from hetlab.train.command_line import as_train_config, command_type

    args = ["--ppo.desired-kl", "None", "--target-return", "400"]
    options, defaults = command_type(args)
    cfg = as_train_config(tyro.cli(options, args=args, default=defaults, registry=OPTION_RULES))
    assert cfg.algos.ppo.desired_kl is None and cfg.target_return == 400.0


def test_aloha_train_shows_each_phase_s_options_in_its_own_group(capsys, refusal):
    from hetlab.cli.aloha import aloha_train

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        parser = tyro.extras.get_parser(aloha_train, registry=OPTION_RULES)
    groups = {group.title: {action.option_strings[0] for action in group._group_actions}
              for group in parser._action_groups if group._group_actions}
    assert list(groups) == ["options", "Phase A and B options", "Phase A options", "Phase B options", "quantise options",
                            "tracker options"]
    assert groups["tracker options"] == {"--logger", "--run-name", "--tags", "--group"}
    assert groups["options"] == {"-h", "--phase"}
    assert {"--steps", "--lr", "--seed", "--batch", "--device", "--precision", "--resume"} <= groups["Phase A and B options"]
    assert {"--dataset", "--preset", "--keep-checkpoints", "--compile"} <= groups["Phase A options"]
    assert {"--from", "--condition", "--offload-device", "--cache-dtype", "--out"} <= groups["Phase B options"]
    assert not groups["Phase A options"] & (groups["Phase B options"] | groups["quantise options"])
    text = help_of(["aloha", "train"], capsys)
    assert [text.index(title) for title in groups] == sorted(text.index(title) for title in groups)
    # Each phase refuses the other's options, the --quantise.* group included.
    assert "--quantise.* is an option of Phase B" in refusal("aloha", "train", "--quantise.method", "minmax")
    assert "--dataset is an option of Phase A" in refusal("aloha", "train", "--phase", "B", "--dataset", "data")


def test_help_imports_neither_torch_nor_mujoco_nor_numpy():
    """Each help in a row in one interpreter; the heavy modules present after each are printed, so a
    failure names the first command whose help imported one."""
    code = ("import json, sys\nfrom hetlab.cli import main\n"
            f"for line in {EVERY_COMMAND!r}:\n"
            "    try:\n        main([*line, '--help'])\n    except SystemExit:\n        pass\n"
            f"    print(json.dumps([line, sorted(m for m in {HEAVY!r} if m in sys.modules)]), file=sys.stderr)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    imported = [json.loads(row) for row in result.stderr.splitlines()]
    assert len(imported) == len(EVERY_COMMAND)
    assert [(line, heavy) for line, heavy in imported if heavy] == []


@pytest.mark.serial
@pytest.mark.parametrize("line", [[], ["train"], ["aloha", "train"]], ids=lambda line: " ".join(line) or "hetlab")
def test_help_is_quick(line):
    """Under 0.5 s on an idle 2-core machine; the bound leaves room for a busy one."""
    seconds = []
    for _ in range(3):
        start = time.perf_counter()
        subprocess.run([HETLAB, *line, "--help"], capture_output=True, check=True, timeout=60)
        seconds.append(time.perf_counter() - start)
    assert statistics.median(seconds) < 1.5, seconds
