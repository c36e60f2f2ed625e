"""Prints what building torch_ddl against this interpreter's torch needs, as CMake `set()` lines.

Run by python/CMakeLists.txt once per interpreter (Debian's /usr/bin/python3 with torch 1.13, a venv's torch
2.x) and by setup.py's build. Reads torch's own answers instead of TorchConfig.cmake, so that several torches
can be built for in one CMake tree. Exits non-zero with one line on stderr when this interpreter cannot
build it (no torch, no torch.distributed, no Python headers, no pybind11).

What it reads of the torch a build is for (BUILT_FOR: torch_ddl/_abi.py's describe(); PYBIND11) goes into the
built package's torch_ddl/_built_for.py, which `import torch_ddl` checks: CMake fills built_for.py.in with
configure_file, setup.py with write_record() below.
"""

import importlib.util
import os
import re
import sys
import sysconfig

HERE = os.path.dirname(os.path.abspath(__file__))


def fail(why):
    sys.stderr.write(why + "\n")
    sys.exit(1)


def abi_module():
    """torch_ddl/_abi.py, loaded by its path (importing the package would load the extension)."""
    spec = importlib.util.spec_from_file_location("torch_ddl_abi", os.path.join(HERE, "torch_ddl", "_abi.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pybind11_version(include):
    """The version of the pybind11 headers in include, as "3.0.1" (empty where they do not say)."""
    try:
        with open(os.path.join(include, "pybind11", "detail", "common.h")) as f:
            text = f.read()
    except OSError:
        return ""
    parts = [re.search(r"#\s*define\s+PYBIND11_VERSION_%s\s+(\d+)" % p, text) for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(m.group(1) for m in parts) if all(parts) else ""


def write_record(path, info, source_dir):
    """Writes torch_ddl/_built_for.py at path for setup.py's build, from info (torch_build_info()) and the
    template python/CMakeLists.txt fills for its own builds."""
    with open(os.path.join(HERE, "built_for.py.in")) as f:
        text = f.read()
    for key, value in (("BUILT_FOR", info["BUILT_FOR"]), ("PYBIND11", info["PYBIND11"]), ("BUILT_BY", "setup.py"),
                       ("SOURCE_DIR", source_dir), ("PACKAGE_DIR", ""), ("BUILD_DIR", ""), ("TORCH_PYTHONS", ""),
                       ("SIBLINGS", "")):
        text = text.replace("@%s@" % key, value)
    with open(path, "w") as f:
        f.write(text)


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
    built_for = abi_module().describe(torch)
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
        "CXX11_ABI": "1" if built_for["cxx11_abi"] else "0",
        "EXT_SUFFIX": sysconfig.get_config_var("EXT_SUFFIX"),
        "CUDA": "1" if torch.version.cuda else "0",
        "BUILT_FOR": repr(built_for),
        "PYBIND11": pybind11_version(pybind11_include),
    }


def main():
    for key, value in torch_build_info().items():
        print('set(DDL_TORCH_%s "%s")' % (key, value))


if __name__ == "__main__":
    main()
