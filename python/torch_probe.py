"""Prints what building torch_ddl against this interpreter's torch needs, as CMake `set()` lines.

Run by python/CMakeLists.txt once per interpreter (Debian's /usr/bin/python3 with torch 1.13, a venv's torch
2.x) and by setup.py's build. Reads torch's own answers instead of TorchConfig.cmake, so that several torches
can be built for in one CMake tree. Exits non-zero with one line on stderr when this interpreter cannot
build it (no torch, no torch.distributed, no Python headers, no pybind11).
"""

import os
import sys
import sysconfig


def fail(why):
    sys.stderr.write(why + "\n")
    sys.exit(1)


def torch_build_info():
    try:
        import torch
        import torch.distributed as dist
        import torch.utils.cpp_extension as ext
    except Exception as e:  # noqa: BLE001  (any import failure means: no torch here)
        fail("cannot import torch: %s" % e)
    if not dist.is_available():
        fail("this torch %s was built without torch.distributed" % torch.__version__)
    includes = [p for p in ext.include_paths() if os.path.isdir(p)]
    torch_include = includes[0]
    # The pybind11 torch was built with: its own copy where the wheel carries one (torch 2.x), else the
    # system's (Debian builds torch against pybind11-dev). A module built with another pybind11 cannot see
    # torch's classes (another internals version).
    if os.path.isfile(os.path.join(torch_include, "pybind11", "pybind11.h")):
        pybind11_include = torch_include
    else:
        try:
            import pybind11
            pybind11_include = pybind11.get_include()
        except ImportError:
            pybind11_include = "/usr/include"
        if not os.path.isfile(os.path.join(pybind11_include, "pybind11", "pybind11.h")):
            fail("pybind11 headers not found (torch carries none; install pybind11-dev)")
    python_include = sysconfig.get_paths()["include"]
    if not os.path.isfile(os.path.join(python_include, "Python.h")):
        fail("no Python headers in %s (install python3-dev)" % python_include)
    version = torch.__version__.split("+")[0]
    major, minor = (int(x) for x in version.split(".")[:2])
    return {
        "VERSION": torch.__version__,
        "MAJOR": str(major),
        "MINOR": str(minor),
        "INCLUDE_DIRS": ";".join(includes),
        "PYBIND11_INCLUDE": pybind11_include,
        "PYTHON_INCLUDE": python_include,
        "LIB_DIRS": ";".join(ext.library_paths()),
        "CXX11_ABI": "1" if torch._C._GLIBCXX_USE_CXX11_ABI else "0",
        "EXT_SUFFIX": sysconfig.get_config_var("EXT_SUFFIX"),
        "CUDA": "1" if torch.version.cuda else "0",
    }


def main():
    for key, value in torch_build_info().items():
        print('set(DDL_TORCH_%s "%s")' % (key, value))


if __name__ == "__main__":
    main()
