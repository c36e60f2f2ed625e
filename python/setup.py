"""Builds torch_ddl (the torch.distributed backend "ddl") for the torch of the running interpreter.

    pip install --no-build-isolation ./python          # from a ddl checkout, in the venv or conda env of torch

libddl comes from pkg-config (`ddl.pc`: the libddl package installs it in /usr/lib/pkgconfig, a
`cmake --install` in <prefix>/lib/pkgconfig, a build tree in build/pkgconfig; PKG_CONFIG_PATH points at the
latter two), or from DDL_PREFIX (<prefix>/include/ddl/ddl.h and <prefix>/lib/libddl.so). The extension
records where libddl is installed as its run path (ddl.pc's installlibdir), so no LD_LIBRARY_PATH is needed:
an installed libddl's own directory; for a build tree, where `cmake --install` of that build puts libddl (its
CMAKE_INSTALL_PREFIX/lib), never the build tree itself, which a user removes or rebuilds. Where libddl was built with CUDA
(`pkg-config --variable=cuda ddl` is yes), collectives on CUDA tensors are stream-ordered (torch >= 2.10).
The CMake build (python/CMakeLists.txt) compiles the same sources (every src/*.cpp) for the torches it finds.
Like it, the build records the torch it is for in torch_ddl/_built_for.py, which `import torch_ddl` checks.
"""

import glob
import os
import shlex
import subprocess
import sys

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_probe  # noqa: E402  (python/torch_probe.py: what this torch is, as the CMake build reads it)


def pkg_config(*args):
    return subprocess.run(["pkg-config", *args, "ddl"], check=True, capture_output=True, text=True).stdout.strip()


def libddl():
    """(include dirs, library dirs, libraries, run path, takes CUDA) of the libddl to build against."""
    prefix = os.environ.get("DDL_PREFIX")
    if prefix:
        cuda = os.environ.get("DDL_LIBDDL_CUDA", "no") == "yes"
        lib = os.path.join(prefix, "lib")
        return [os.path.join(prefix, "include")], [lib], ["ddl"], [lib], cuda
    try:
        cflags, libs = shlex.split(pkg_config("--cflags")), shlex.split(pkg_config("--libs"))
        cuda = pkg_config("--variable=cuda") == "yes"
        installed = pkg_config("--variable=installlibdir")  # empty in a ddl.pc older than libddl 0.2
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit("torch_ddl: libddl not found: pkg-config ddl failed (%s). Install the libddl package, or "
                         "set PKG_CONFIG_PATH to <prefix>/lib/pkgconfig of a `cmake --install` (or a build tree's "
                         "build/pkgconfig), or DDL_PREFIX to its prefix." % e)
    includes = [f[2:] for f in cflags if f.startswith("-I")]
    libdirs = [f[2:] for f in libs if f.startswith("-L")]
    names = [f[2:] for f in libs if f.startswith("-l")]
    runpath = [installed] if installed else libdirs
    if runpath != libdirs:
        print("torch_ddl: linking against the libddl of a build tree (%s); the extension will load libddl from "
              "%s, where `cmake --install` of that build puts it (or from LD_LIBRARY_PATH)"
              % (" ".join(libdirs), " ".join(runpath)))
    return includes, libdirs, names, runpath, cuda


class BuildExtensionRecorded(BuildExtension):
    """torch's BuildExtension, which then writes torch_ddl/_built_for.py next to the extension: the torch it
    was built for, which `import torch_ddl` checks before it loads the extension (torch_ddl/_abi.py)."""

    def run(self):
        super().run()
        package = os.path.dirname(self.get_ext_fullpath("torch_ddl._C"))
        torch_probe.write_record(os.path.join(package, "_built_for.py"), torch_probe.torch_build_info(),
                                 os.path.dirname(HERE))


includes, libdirs, libraries, runpath, cuda = libddl()
setup(
    name="torch-ddl",
    packages=["torch_ddl"],
    package_dir={"torch_ddl": "torch_ddl"},
    ext_modules=[
        CppExtension(
            "torch_ddl._C",
            sorted(glob.glob("src/*.cpp")),  # every source of src/, as python/CMakeLists.txt
            include_dirs=["src"] + includes,
            library_dirs=libdirs,
            libraries=libraries,
            runtime_library_dirs=runpath,
            define_macros=[("DDL_LIBDDL_CUDA", None)] if cuda else [],
            extra_compile_args=["-std=c++17", "-Wno-unused-parameter"],
        )
    ],
    cmdclass={"build_ext": BuildExtensionRecorded},
)
