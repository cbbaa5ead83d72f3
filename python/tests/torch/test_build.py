"""The torch backend's extension is built ahead of time: importing
cxlrt.torch_backend loads the prebuilt cxlrt_torch_backend and compiles
nothing (TORCH_EXTENSIONS_DIR stays empty), and refuses with an error that
says how to rebuild when the module is missing or was built against another
torch. DDP's logging names the backend. Run with the project's venv and
PYTHONPATH=build/python (tests/CMakeLists.txt)."""

import os
import shutil
import socket
import subprocess
import sys
import textwrap

import cxlrt

PKG = os.path.dirname(os.path.abspath(cxlrt.__file__))


def _run(code, env_extra, cwd=None):
    env = dict(os.environ)
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=600)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_prebuilt_extension_compiles_nothing_and_ddp_names_the_backend(tmp_path):
    ext_dir = tmp_path / "torch_extensions"
    ext_dir.mkdir()
    r = _run(
        """
        import os
        import torch
        import torch.distributed as dist
        import cxlrt.torch_backend as tb
        assert tb.EXTENSION_ORIGIN == "prebuilt", tb.EXTENSION_ORIGIN
        pkg = os.path.dirname(os.path.abspath(tb.__file__))
        assert os.path.dirname(os.path.abspath(tb._extension().__file__)) == pkg, \\
            tb._extension().__file__
        dist.init_process_group("cxlrt", rank=0, world_size=1)
        assert dist.get_backend() == "cxlrt", dist.get_backend()
        x = torch.arange(10, dtype=torch.float32)
        dist.all_reduce(x)
        assert torch.equal(x, torch.arange(10, dtype=torch.float32)), x
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
        model(torch.ones(3, 4)).sum().backward()
        name = model._get_ddp_logging_data()["backend_name"]
        assert name == "cxlrt", name
        assert dist.group.WORLD.name() == "cxlrt", dist.group.WORLD.name()
        dist.destroy_process_group()
        print("OK")
        """,
        {"TORCH_EXTENSIONS_DIR": str(ext_dir), "MASTER_ADDR": "127.0.0.1",
         "MASTER_PORT": str(_free_port()), "CXLRT_TORCH_JIT": ""})
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr
    assert os.listdir(ext_dir) == [], os.listdir(ext_dir)


def test_other_torch_version_is_refused_clearly():
    r = _run(
        """
        import torch
        built = torch.__version__
        torch.__version__ = "0.0.1"
        try:
            import cxlrt.torch_backend
        except ImportError as e:
            print("REFUSED", e)
        """, {"CXLRT_TORCH_JIT": ""})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "REFUSED" in r.stdout, r.stdout + r.stderr
    assert "was built against torch" in r.stdout and "0.0.1" in r.stdout, r.stdout
    assert "cmake --build build --target cxlrt_torch_backend" in r.stdout, r.stdout
    assert "CXLRT_TORCH_JIT=1" in r.stdout, r.stdout


def test_missing_extension_says_how_to_build(tmp_path):
    # The package without the compiled backend, as a build without torch
    # leaves it.
    copy = tmp_path / "cxlrt"
    shutil.copytree(PKG, copy, ignore=shutil.ignore_patterns(
        "cxlrt_torch_backend*", "_torch_build.py", "__pycache__"))
    r = _run(
        """
        import cxlrt
        assert cxlrt.__file__.startswith(%r), cxlrt.__file__
        try:
            import cxlrt.torch_backend
        except ImportError as e:
            print("REFUSED", e)
        """ % str(tmp_path),
        {"PYTHONPATH": str(tmp_path), "CXLRT_TORCH_JIT": ""}, cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "REFUSED" in r.stdout and "is not built" in r.stdout, r.stdout + r.stderr
    assert "cmake --build build --target cxlrt_torch_backend" in r.stdout, r.stdout
    assert "CXLRT_TORCH_JIT=1" in r.stdout, r.stdout
