// arguments.cpp: torch_ddl's refusals at the call (arguments.h).
#include "arguments.h"

#include <stdexcept>

namespace torch_ddl {

void refuse(const std::string& what) { throw std::invalid_argument("ddl: " + what); }

const at::Tensor& single(const std::vector<at::Tensor>& tensors, const char* what) {
  if (tensors.size() != 1) {
    refuse(std::string(what) + " takes one tensor per process (one device per process), got " +
           std::to_string(tensors.size()));
  }
  if (!tensors[0].defined()) refuse(std::string(what) + ": the tensor is undefined");
  return tensors[0];
}

std::vector<at::Tensor> groupList(const std::vector<std::vector<at::Tensor>>& lists, int size, const char* what,
                                  const char* which) {
  if (lists.size() != 1 || lists[0].size() != static_cast<size_t>(size)) {
    refuse(std::string(what) + " needs one " + which + " list of " + std::to_string(size) +
           " tensors (the group's size)");
  }
  return lists[0];
}

std::vector<at::Tensor> rootList(const std::vector<std::vector<at::Tensor>>& lists, int size, int rank, int root,
                                 const char* what, const char* which) {
  if (rank == root) return groupList(lists, size, what, which);
  if (!lists.empty()) {
    refuse(std::string(what) + " takes " + which + " tensors on the root only (rank " + std::to_string(root) + ")");
  }
  return {};
}

void checkSameBytes(const std::vector<at::Tensor>& tensors, size_t bytes, const char* what) {
  for (const auto& t : tensors) {
    if (t.nbytes() != bytes) {
      refuse(std::string(what) + ": every tensor of the list must have the input's size (" + std::to_string(bytes) +
             " bytes), one has " + std::to_string(t.nbytes()));
    }
  }
}

}  // namespace torch_ddl
