// torch_ddl._C: the Python side of ProcessGroupDDL. torch_ddl/__init__.py registers the backend "ddl" with
// torch.distributed, whose init_process_group and new_group then call ProcessGroupDDL(store, rank, size,
// timeout) for every group. Built against the pybind11 of the torch at hand (python/torch_probe.py), so that
// torch's classes (Backend or ProcessGroup, Store, Work) are the ones it derives from.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>

#include "process_group_ddl.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch.distributed backend 'ddl' over libddl";
  // The base classes (Backend or ProcessGroup, Store, Work) are torch's: registered when torch.distributed loads.
  py::module::import("torch.distributed");
  py::class_<torch_ddl::ProcessGroupDDL, torch_ddl::GroupBase,
             c10::intrusive_ptr<torch_ddl::ProcessGroupDDL>>(
      m, "ProcessGroupDDL",
      "A torch.distributed process group over libddl. Made by torch.distributed.init_process_group('ddl') "
      "and new_group(backend='ddl') once torch_ddl is imported.")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout) {
             return c10::make_intrusive<torch_ddl::ProcessGroupDDL>(store, rank, size, timeout);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly(
          "topology", &torch_ddl::ProcessGroupDDL::topology,
          "The multi-dimensional ring libddl runs on, e.g. '2x2' (DDL_TOPOLOGY), or the rank count")
      .def_property_readonly(
          "stream_scheme", &torch_ddl::ProcessGroupDDL::streamScheme,
          "How libddl runs this group's collectives on CUDA tensors: 'kernel' (enqueued, one "
          "kernel per collective), 'host' (host-paced: each call waits for the stream and "
          "returns once done) or 'unset' (before the first)")
      .def_property_readonly(
          "registered_buffers", &torch_ddl::ProcessGroupDDL::registeredBuffers,
          "How many CUDA allreduce storages (DDP's buckets) torch_ddl has registered with libddl, so that "
          "their allreduces read and write them in place (zero-copy); TORCH_DDL_REGISTER=0 turns this off")
      .def_property_readonly("blocking", &torch_ddl::ProcessGroupDDL::blocking,
                             "True when TORCH_DDL_BLOCKING=1 runs collectives on the calling thread")
      .def_property_readonly(
          "rank_lost", &torch_ddl::ProcessGroupDDL::rankLost,
          "True once a peer of the group is gone (its collectives failed on a dead or timed-out "
          "rank): shrink() goes on without it")
      .def("shrink", &torch_ddl::ProcessGroupDDL::shrink, py::call_guard<py::gil_scoped_release>(),
           "Every rank that goes on calls it after a lost rank: the survivors agree on who is gone and "
           "return a "
           "new group of themselves, numbered in the old order (libddl's ddlCommShrink)")
      .def("grow", &torch_ddl::ProcessGroupDDL::grow, py::arg("max_new") = 0,
           py::call_guard<py::gil_scoped_release>(),
           "A collective: a new group of this one's ranks and up to max_new (0: all) processes waiting in "
           "join(), "
           "or None when none waits (libddl's ddlCommGrow)")
      .def_static("join", &torch_ddl::ProcessGroupDDL::join, py::arg("store"), py::arg("timeout"),
                  py::call_guard<py::gil_scoped_release>(),
                  "Waits until a group meeting through store grows to admit this process; returns its group")
      .def_property_readonly("excluded", &torch_ddl::ProcessGroupDDL::excluded,
                             "Made by shrink(): the old group's ranks it left out")
      .def("close", &torch_ddl::ProcessGroupDDL::closeNow, py::call_guard<py::gil_scoped_release>(),
           "Closes the group now (its calls fail from then on); every rank at the same point")
      .def_property_readonly("timeout", &torch_ddl::ProcessGroupDDL::timeout, "The group's timeout")
      .def_property_readonly_static(
          "stream_ordered", [](py::object) { return torch_ddl::ProcessGroupDDL::streamOrdered(); },
          "True where collectives on CUDA tensors are enqueued on a CUDA stream (torch >= 2.0 and a libddl "
          "built with CUDA) instead of staged through host memory");
#if TORCH_DDL_NAMED_GROUP
  py::class_<torch_ddl::NamedProcessGroup, c10d::ProcessGroup, c10::intrusive_ptr<torch_ddl::NamedProcessGroup>>(
      m, "NamedProcessGroup",
      "torch's ProcessGroup over a ProcessGroupDDL for CPU and CUDA tensors, named 'ddl' (torch names a plugin's "
      "group 'custom'); what torch_ddl's creator returns to torch >= 2.1")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       const c10::intrusive_ptr<torch_ddl::ProcessGroupDDL>& backend) {
             return c10::make_intrusive<torch_ddl::NamedProcessGroup>(store, rank, size, backend);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("backend"));
#endif
  m.attr("has_named_group") = py::bool_(TORCH_DDL_NAMED_GROUP != 0);
  m.def(
      "libddl_version",
      [] {
        int v = 0;
        ddlGetVersion(&v);
        return v;
      },
      "The version of the libddl in use, as DDL_VERSION_CODE (major * 10000 + minor * 100 + patch)");
}
