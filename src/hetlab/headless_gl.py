"""An OpenGL backend for mujoco.Renderer without a display: EGL, else OSMesa.

mujoco picks its backend once, from MUJOCO_GL, when `import mujoco` imports
`mujoco.rendering.classic.gl_context`; each mujoco.Renderer then builds that module's
`GLContext`. Unset, MUJOCO_GL means GLFW, which needs a display. mujoco's EGL and OSMesa
modules also pin PyOpenGL to their platform for the life of the process, so a backend that
fails here cannot be swapped for another. Hence:

- a MUJOCO_GL the user set is used as it is;
- otherwise each candidate renders a frame in a child process, and the first that succeeds
  is written to MUJOCO_GL;
- then mujoco's gl_context module is reloaded, so the next Renderer uses that backend even
  if mujoco was imported before MUJOCO_GL was set.

`working_backend()` is the check before work starts, for a command that renders later in a
process of its own: it tries MUJOCO_GL too, and names the backend to hand that process.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import mujoco
import mujoco.rendering.classic.gl_context as gl_context

from hetlab.errors import UserError

CANDIDATES = ("egl", "osmesa")
APT_PACKAGES = {"egl": "libegl1 libegl-mesa0 libgl1-mesa-dri libgles2", "osmesa": "libosmesa6"}
_PROBE = ("import mujoco; r = mujoco.Renderer(mujoco.MjModel.from_xml_string('<mujoco/>'), 8, 8); "
          "r.render(); r.close()")
PROBE_TIMEOUT_S = 60


def make_renderer(model: mujoco.MjModel, width: int, height: int) -> mujoco.Renderer:
    """A mujoco.Renderer on a headless backend, or a UserError saying how to get one."""
    backend = os.environ.get("MUJOCO_GL") or _first_working()
    os.environ["MUJOCO_GL"] = backend
    try:
        importlib.reload(gl_context)  # re-reads MUJOCO_GL, which may have changed since `import mujoco`
        return mujoco.Renderer(model, height, width)
    except Exception as e:  # the backends fail with ImportError, RuntimeError, GLError, FatalError, ...
        raise UserError(f"MUJOCO_GL={backend} cannot render ({e}); {install_hint()}, "
                        "or unset MUJOCO_GL to let hetlab pick") from e


def working_backend() -> str:
    """A backend that renders here, tried in a child process: MUJOCO_GL if it is set, else the first
    of CANDIDATES that works; a UserError saying how to get one. For a check before work starts."""
    backend = os.environ.get("MUJOCO_GL")
    if not backend:
        return _first_working()
    if not _renders(backend):
        raise UserError(f"MUJOCO_GL={backend} cannot render; {install_hint()}, or unset MUJOCO_GL to let hetlab pick")
    return backend


def _first_working() -> str:
    backend = next((b for b in CANDIDATES if _renders(b)), None)
    if backend is None:
        raise UserError(f"no headless OpenGL backend works (tried MUJOCO_GL={' and '.join(CANDIDATES)}); "
                        f"{install_hint()}")
    return backend


def install_hint() -> str:
    return f"install EGL (apt-get install {APT_PACKAGES['egl']}) or OSMesa (apt-get install {APT_PACKAGES['osmesa']})"


def _renders(backend: str) -> bool:
    env = {**os.environ, "MUJOCO_GL": backend}
    try:
        probe = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return False
    return probe.returncode == 0
