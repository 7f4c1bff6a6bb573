"""The documentation holds together: every relative link in README.md and docs/*.md reaches a file
(and, into a markdown page, a heading), and every `hetlab …` line of their ```bash blocks names a
command that exists and only options that command's help lists."""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import shlex
from pathlib import Path

import pytest

from hetlab.algos import ALGO_CONFIGS
from hetlab.cli import every_command, main
from hetlab.cli.parsing import Group

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.S | re.M)
CODE_SPAN = re.compile(r"(`+).+?\1", re.S)
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'(][^)]*)?\)")
REFERENCE_LINK = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$", re.M)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


# ---- links -------------------------------------------------------------------------------------

def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the text as rendered (links become their text), lowercased,
    punctuation but '-' and '_' dropped, each space a '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor on a markdown page; a repeated one gets -1, -2, … as on GitHub."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for match in re.finditer(r"^ {0,3}#{1,6}[ \t]+(.+?)[ \t#]*$", FENCE.sub("", page.read_text()), re.M):
        base = slug(match[1])
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(text: str) -> list[str]:
    """The targets of a page's inline and reference links and images, code left out."""
    prose = CODE_SPAN.sub("", FENCE.sub("", text))
    return INLINE_LINK.findall(prose) + REFERENCE_LINK.findall(prose)


def broken_links(page: Path) -> list[str]:
    """Each relative link of `page` that reaches no file, or no heading of the markdown page it names."""
    broken = []
    for target in links(page.read_text()):
        if SCHEME.match(target) or target.startswith("//"):
            continue  # http(s), mailto: not a file of the repository
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor.lower() not in anchors(file):
            broken.append(f"{target}: no heading with that anchor in {_rel(file)}")
    return broken


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:  # a page outside the repository (the checker's own test)
        return str(path)


# ---- commands ----------------------------------------------------------------------------------

PLACEHOLDER = "runs/task-algo/20260101-000000"  # what `$RUN`, `${RUN}` or `$(…)` stands for
STARTS_COMMAND = re.compile(r"^(?:[A-Za-z_]\w*=\S*\s+)*hetlab(?=\s|$)")


def hetlab_lines(block: str) -> list[str]:
    """The `hetlab …` command lines of a bash block, comments dropped, a line ending in `\\` joined
    with the next, and so is an indented `[--option …]` line of a synopsis."""
    commands: list[str] = []
    open_ = False  # the last command may go on on the next line
    joining = False  # the last line ended in a backslash
    for raw in block.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", raw).rstrip()
        continues = line.endswith("\\")
        line = line.removesuffix("\\").strip()
        if joining or (open_ and raw[:1].isspace() and line.startswith(("[", "-"))):
            commands[-1] += " " + line
        elif STARTS_COMMAND.match(line):
            commands.append(line)
            open_ = True
        elif line:
            open_ = False
        joining = continues and bool(commands) and open_
    return commands


def command_words(line: str) -> list[str] | None:
    """The words after `hetlab`, placeholders and substitutions replaced by a path; None when the
    line holds a substitution that cannot be told apart from the words around it."""
    line = STARTS_COMMAND.sub("hetlab", line)
    line = re.sub(r"\$\([^()`]*\)|\$\{\w+\}|\$\w+", PLACEHOLDER, line)
    if "$(" in line or "`" in line:
        return None
    try:
        words = shlex.split(line)
    except ValueError:  # an unmatched quote in a synopsis: split on spaces
        words = line.split()
    return [word.strip("[]") for word in words[1:]]


@contextlib.contextmanager
def wide_terminal():
    """Help laid out on one wide page, so no option's name is wrapped."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "400"
    try:
        yield
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old


@functools.cache
def help_options(*args: str) -> frozenset[str]:
    """The options `hetlab ARGS --help` lists."""
    out = io.StringIO()
    with wide_terminal(), contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
        main([*args, "--help"])
    assert exit_.value.code == 0, f"hetlab {' '.join(args)} --help exited with {exit_.value.code}"
    return frozenset(flag.rstrip(".-") for flag in re.findall(r"(?<![\w-])--?[A-Za-z][\w.-]*", out.getvalue()))


def flag_name(word: str) -> str | None:
    match = re.match(r"^(--?[A-Za-z][\w.-]*)", word)
    return match[1].split("=")[0] if match else None


def command_problems(line: str) -> list[str]:
    """What is wrong with a documented `hetlab …` line: a command that does not exist, or an option
    its command's help does not list. Empty when it parses."""
    words = command_words(line)
    if words is None:
        return []
    target: Group | object = every_command()
    path: list[str] = []
    while isinstance(target, Group) and words and not words[0].startswith("-"):
        name = words.pop(0)
        if name not in target.commands:
            return [f"`hetlab {' '.join([*path, name])}`: no such command (hetlab {' '.join(path)} has "
                    f"{', '.join(target.commands)})"]
        path.append(name)
        target = target.commands[name]
    flags = [flag for word in words if (flag := flag_name(word))]
    if not path:  # `hetlab --version`, `hetlab --help`
        return [f"`hetlab {flag}`: hetlab takes no such option" for flag in flags
                if flag not in ("--version", "--help", "-h")]
    if isinstance(target, Group):
        return [f"`hetlab {' '.join(path)}` is a group: name one of {', '.join(target.commands)}"]
    helps = [help_options(*path)]
    if path == ["train"]:  # its help lists the chosen algorithm's options (PPO's when none is chosen)
        chosen = [word.split("=", 1)[1] if "=" in word else (words[i + 1] if i + 1 < len(words) else "")
                  for i, word in enumerate(words) if word.split("=")[0] == "--algo"]
        algos = [algo for value in chosen for algo in value.split("|") if algo in ALGO_CONFIGS]
        if chosen and not algos:  # a placeholder (`--algo A`): any algorithm's options
            algos = list(ALGO_CONFIGS)
        helps = [help_options("train", "--algo", algo) for algo in algos or ["ppo"]]
    known = frozenset().union(*helps)
    return [f"`hetlab {' '.join(path)} {flag}`: not an option of hetlab {' '.join(path)}"
            for flag in dict.fromkeys(flags) if flag not in known]


def documented_commands() -> list[tuple[str, str]]:
    """(where, line) for every `hetlab …` line in a ```bash block of the README and the docs pages."""
    found = []
    for page in PAGES:
        for block in re.findall(r"^[ \t]*```bash[ \t]*\n(.*?)^[ \t]*```", page.read_text(), re.S | re.M):
            found += [(f"{page.relative_to(ROOT)}: {line[:60]}", line) for line in hetlab_lines(block)]
    return found


COMMANDS = documented_commands()


# ---- the documentation -------------------------------------------------------------------------

@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file_and_heading(page):
    assert broken_links(page) == []


def test_the_pages_hold_commands_to_check():
    pages = {where.split(":")[0] for where, _ in COMMANDS}
    assert {"README.md", "docs/cli.md", "docs/rl.md", "docs/imitation.md"} <= pages
    assert len(COMMANDS) > 30


@pytest.mark.parametrize(("where", "line"), COMMANDS, ids=[where for where, _ in COMMANDS])
def test_every_documented_command_line_parses(where, line):
    assert command_problems(line) == []


# ---- the checks themselves fail where they should ------------------------------------------------

def test_slugs_follow_github():
    assert slug("Time to solve") == "time-to-solve"
    assert slug("The `cpu` preset: 100 % on held-out seeds") == "the-cpu-preset-100--on-held-out-seeds"
    assert slug("Quick start: cartpole, trained until solved") == "quick-start-cartpole-trained-until-solved"
    assert slug("Phase B's [INT8](x.md) offload_path") == "phase-bs-int8-offload_path"


def test_broken_links_are_found(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## A heading\n\n## A heading\n")
    (tmp_path / "img.png").write_bytes(b"")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n[fine](other.md#a-heading) [second](other.md#a-heading-1) ![image](img.png)\n"
        "[here](#page) [web](https://example.com/none.md) `[code](nowhere.md)`\n\n"
        "```\n[in a block](nowhere.md)\n```\n\n"
        "[missing](missing.md) [bad anchor](other.md#no-such-heading) [local](#nope)\n"
        "[ref]: gone/file.md\n")
    other = tmp_path / "other.md"
    assert broken_links(page) == ["missing.md: no such file",
                                  f"other.md#no-such-heading: no heading with that anchor in {other}",
                                  f"#nope: no heading with that anchor in {page}",
                                  "gone/file.md: no such file"]


def test_command_lines_are_read_as_a_shell_would():
    block = ("hetlab train --task cartpole-balance \\\n    --envs 8  # a comment --not-a-flag\n"
             "RUN=$(ls -d runs/x/* | tail -n 1)\nhetlab eval $RUN --video 1\n"
             "hetlab aloha train --dataset DIR [--preset paper|cpu]\n"
             "                   [--resume RUN]   # Phase A\nmake test\n  [--not-joined]\n")
    assert hetlab_lines(block) == ["hetlab train --task cartpole-balance --envs 8", "hetlab eval $RUN --video 1",
                                   "hetlab aloha train --dataset DIR [--preset paper|cpu] [--resume RUN]"]
    assert command_words("hetlab eval $RUN --video 1") == ["eval", PLACEHOLDER, "--video", "1"]


def test_unknown_commands_and_options_are_found():
    assert command_problems("hetlab eval $(ls -d runs/x/* | tail -n 1) --episodes 8 --video 1") == []
    assert command_problems("hetlab train --algo sac --sac.gamma 0.9 --off-policy.save-replay") == []
    assert command_problems("hetlab --version") == []
    assert command_problems("hetlab trian --task x") != []
    assert command_problems("hetlab aloha") != []
    assert command_problems("hetlab aloha evaluate RUN") != []
    assert command_problems("hetlab eval RUN --no-such-option 3") == [
        "`hetlab eval --no-such-option`: not an option of hetlab eval"]
    # train lists the chosen algorithm's options: SAC's are not PPO's
    assert command_problems("hetlab train --sac.gamma 0.9") != []
    assert command_problems("hetlab train --algo ppo|sac --sac.gamma 0.9") == []
