// arguments.h: what torch_ddl refuses at the call, before anything is queued: refuse() throws
// std::invalid_argument, which pybind11 raises as ValueError (the group stays usable), and the checks of the
// tensor lists that several collectives share. Any thread.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

namespace torch_ddl {

[[noreturn]] void refuse(const std::string& what);

// The one tensor of a list (one device per process, as NCCL).
const at::Tensor& single(const std::vector<at::Tensor>& tensors, const char* what);

// The one list of group-size tensors a list collective takes (all_gather's outputs, reduce_scatter's inputs).
std::vector<at::Tensor> groupList(const std::vector<std::vector<at::Tensor>>& lists, int size, const char* what,
                                  const char* which);

// The same for a rooted collective (gather's outputs, scatter's inputs): on the root only; empty elsewhere.
std::vector<at::Tensor> rootList(const std::vector<std::vector<at::Tensor>>& lists, int size, int rank, int root,
                                 const char* what, const char* which);

// Every tensor of the list has `bytes` bytes.
void checkSameBytes(const std::vector<at::Tensor>& tensors, size_t bytes, const char* what);

}  // namespace torch_ddl
