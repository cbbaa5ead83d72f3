"""NIXL's CXLRT backend: where its plugin is, and a plugin folder for NIXL.

NIXL loads backends from the folder ``NIXL_PLUGIN_DIR`` names, and that
folder *replaces* the wheel's own plugin folder. ``plugin_dir()`` makes a
folder holding cxlrt's ``libplugin_CXLRT.so`` beside links to the wheel's
plugins (UCX, POSIX, ...), so that every backend stays available
(docs/nixl.md)::

    python -m cxlrt.nixl plugin-dir            # prints the folder
    export NIXL_PLUGIN_DIR=$(python -m cxlrt.nixl plugin-dir)

The plugin moves data through the pool that ``CXLRT_POOL`` names (or its
backend parameter ``pool``).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import importlib.util
import os
import sys
from typing import List, Optional

PLUGIN_NAME = "libplugin_CXLRT.so"


def plugin_path() -> str:
    """The CXLRT plugin of this cxlrt: ``CXLRT_NIXL_PLUGIN`` when set, else
    the one installed with the package (``cxlrt/lib/nixl``), else the build
    tree's (``build/lib/nixl``). Raises FileNotFoundError saying where it
    looked."""
    looked = []
    env = os.environ.get("CXLRT_NIXL_PLUGIN")
    if env:
        if os.path.isfile(env):
            return os.path.abspath(env)
        raise FileNotFoundError(f"CXLRT_NIXL_PLUGIN={env} is not a file")
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.path.join(here, "lib", "nixl", PLUGIN_NAME)]
    try:
        from . import _paths  # written by CMake in a build tree

        candidates.append(os.path.join(_paths.LIB_DIR, "nixl", PLUGIN_NAME))
    except ImportError:
        pass
    for c in candidates:
        looked.append(c)
        if os.path.isfile(c):
            return c
    raise FileNotFoundError(
        f"{PLUGIN_NAME} not found (looked at {', '.join(looked)}); build the project "
        "(cmake --build build --target cxlrt_nixl_plugin) or set CXLRT_NIXL_PLUGIN")


def wheel_plugin_dir() -> str:
    """The plugin folder of the installed NIXL wheel (nixl-cu13, nixl-cu12):
    ``plugins/`` beside its libnixl.so. Raises FileNotFoundError when no NIXL
    wheel is installed."""
    for mod in ("nixl_cu13", "nixl_cu12", "nixl_rocm"):
        spec = importlib.util.find_spec(mod)
        if spec is None or not spec.submodule_search_locations:
            continue
        site = os.path.dirname(list(spec.submodule_search_locations)[0])
        for d in sorted(glob.glob(os.path.join(site, f".{mod}.mesonpy.libs", "plugins"))):
            if os.path.isdir(d):
                return d
    raise FileNotFoundError("no NIXL wheel (nixl-cu13 or nixl-cu12) is installed in "
                            f"{sys.executable}'s environment")


def default_dir() -> str:
    """~/.cache/cxlrt/nixl-plugins/<key>: one folder per Python environment
    and plugin, so that two checkouts (or venvs) never share one folder
    whose links point into the other, nor lose theirs when it is deleted."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    key = hashlib.sha256(f"{sys.prefix}\0{plugin_path()}".encode()).hexdigest()[:12]
    return os.path.join(cache, "cxlrt", "nixl-plugins", key)


def _link(target: str, link: str) -> None:
    if os.path.islink(link) and os.readlink(link) == target:
        return
    tmp = f"{link}.{os.getpid()}.tmp"
    os.symlink(target, tmp)
    os.replace(tmp, link)  # atomic: a NIXL starting now sees the old link or the new


def plugin_dir(path: Optional[str] = None) -> str:
    """Makes (or refreshes) a plugin folder for NIXL_PLUGIN_DIR under ``path``
    (default: ~/.cache/cxlrt/nixl-plugins/<key>, default_dir) and returns its absolute path: a
    link to the CXLRT plugin and one to each plugin of the NIXL wheel.

    The wheel's plugins find their libraries through RPATHs relative to
    their own location ($ORIGIN/.. and $ORIGIN/../../<wheel>.libs), which
    the dynamic loader takes from the path a plugin was opened by, not the
    file a link points to. So the folder is ``path/lib/plugins``, with
    ``path/lib`` holding links to the wheel's libraries beside its plugin
    folder and ``path/<wheel>.libs`` a link to the wheel's bundled ones: the
    wheel's own layout, one level down."""
    path = os.path.abspath(path or default_dir())
    wheel_plugins = wheel_plugin_dir()
    wheel_lib = os.path.dirname(wheel_plugins)  # site-packages/.nixl_cu13.mesonpy.libs
    site = os.path.dirname(wheel_lib)
    bundled = os.path.basename(wheel_lib)[1:].replace(".mesonpy.libs", ".libs")  # nixl_cu13.libs
    lib = os.path.join(path, "lib")
    plugins = os.path.join(lib, "plugins")
    os.makedirs(plugins, exist_ok=True)
    if os.path.isdir(os.path.join(site, bundled)):
        _link(os.path.join(site, bundled), os.path.join(path, bundled))
    for f in os.listdir(wheel_lib):
        if f != "plugins":
            _link(os.path.join(wheel_lib, f), os.path.join(lib, f))
    targets = {PLUGIN_NAME: plugin_path()}
    for f in sorted(os.listdir(wheel_plugins)):
        if f.endswith(".so") and f != PLUGIN_NAME:
            targets[f] = os.path.join(wheel_plugins, f)
    for name in os.listdir(plugins):  # links of an older wheel or build
        full = os.path.join(plugins, name)
        if os.path.islink(full) and name not in targets:
            os.unlink(full)
    for name, target in targets.items():
        _link(target, os.path.join(plugins, name))
    return plugins


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cxlrt.nixl",
                                     description="NIXL's CXLRT backend (docs/nixl.md)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plugin-dir", help="make a NIXL_PLUGIN_DIR folder and print its path")
    p.add_argument("--dir", default=None, help="the folder (default: %(default)s -> "
                   "~/.cache/cxlrt/nixl-plugins/<key of this Python environment and plugin>)")
    sub.add_parser("plugin", help="print the path of libplugin_CXLRT.so")
    args = parser.parse_args(argv)
    try:
        if args.command == "plugin":
            print(plugin_path())
        else:
            print(plugin_dir(args.dir))
    except (FileNotFoundError, OSError) as e:
        print(f"cxlrt.nixl: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
