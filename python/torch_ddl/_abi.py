"""The torch a torch_ddl was built for, and the check `import torch_ddl` makes before it loads the extension.

A torch_ddl (its C++ extension, torch_ddl._C) works only in the torch it was compiled against: torch's C++
classes (c10d::Backend, Work, Store) change between versions, and so does the pybind11 torch carries. Loaded
into another torch it imported without a word and died with SIGSEGV at the first collective (torch 2.11's
build in Debian's torch 1.13: both CPython 3.11, so Python finds nothing to refuse). So every build records
what describe() says of its torch in _built_for.py next to the extension (python/CMakeLists.txt and setup.py
write it from python/built_for.py.in, with what torch_probe.py read), and __init__.py calls check() before it
imports _C. Plain Python: nothing here loads C++, and torch_probe.py loads this file by its path.
"""

import os

# What torch says of its pybind11's ABI where it says it (torch 1.13 does; torch 2.x does not: there the
# version, which pins the pybind11 the wheel carries and torch_ddl compiles with, stands for it).
_PYBIND11_ABI = ("_PYBIND11_COMPILER_TYPE", "_PYBIND11_STDLIB", "_PYBIND11_BUILD_ABI")


def describe(torch):
    """What a torch_ddl must match of the torch that imports it: its version, its C++ ABI, its pybind11 ABI."""
    return {
        "torch": str(torch.__version__),
        "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        "pybind11_abi": "".join(getattr(torch._C, name, "") for name in _PYBIND11_ABI) or None,
    }


def _say(torch, pybind11=None):
    said = ["C++11 ABI" if torch["cxx11_abi"] else "pre-C++11 ABI"]
    if pybind11:
        said.append("pybind11 " + pybind11)
    if torch["pybind11_abi"]:
        said.append("pybind11 ABI " + torch["pybind11_abi"])
    return "torch %s (%s)" % (torch["torch"], ", ".join(said))


def _same_dir(a, b):
    return os.path.realpath(a) == os.path.realpath(b)


def _fix(record, have, python, package):
    """The command that gives `python` a torch_ddl for the torch `have`."""
    if record.BUILT_BY == "cmake" and _same_dir(package, record.PACKAGE_DIR):
        for built_for, target, path in record.SIBLINGS:
            if built_for == have:
                return "This build tree builds one for torch %s: `cmake --build %s --target %s`, then " \
                       "PYTHONPATH=%s" % (have["torch"], record.BUILD_DIR, target, path)
        pythons = record.TORCH_PYTHONS + ([] if python in record.TORCH_PYTHONS else [python])
        return "Build one in this build tree: `cmake -S %s -B %s -DDDL_TORCH_PYTHONS=\"%s\" && " \
               "cmake --build %s` (configuring asks each torch anew and names the folder for PYTHONPATH)" % (
                   record.SOURCE_DIR, record.BUILD_DIR, ";".join(pythons), record.BUILD_DIR)
    source = os.path.join(record.SOURCE_DIR, "python")
    if not os.path.isfile(os.path.join(source, "setup.py")):
        source = "<a ddl checkout>/python"
    return "Build one in this environment: `%s -m pip install --no-build-isolation %s`" % (python, source)


def check(torch, record, python, package):
    """Raises ImportError unless the torch_ddl in `package`, whose record (the _built_for module, or None
    where it has none) says what it was built for, may be loaded into `torch`, which `python` runs."""
    if record is None:
        raise ImportError(
            "torch_ddl in %s has no record of the torch it was built for (_built_for.py, which "
            "python/CMakeLists.txt and setup.py write), so it cannot tell whether %s's torch %s can load it. "
            "Build it for this torch: `cmake --build` of a ddl build tree, or `%s -m pip install "
            "--no-build-isolation ./python` in a ddl checkout" % (package, python, torch.__version__, python))
    have = describe(torch)
    if record.BUILT_FOR == have:
        return
    raise ImportError(
        "torch_ddl in %s was built for %s, but %s runs %s: a torch_ddl loaded into another torch crashes at "
        "its first collective. %s" % (
            package, _say(record.BUILT_FOR, record.PYBIND11), python, _say(have),
            _fix(record, have, python, package)))
