// reduce_ops.h: how torch's reductions map onto libddl's: the libddl type of a tensor's elements, the libddl
// op of a c10d::ReduceOp (refusing what libddl cannot do, as a ValueError), and PREMUL_SUM's factor. Pure
// functions of their arguments; any thread.
//
// bool: SUM is MAX (a logical or) and PRODUCT is MIN (a logical and), as NCCL does; complex: SUM and AVG on the
// real view (two libddl elements per element). ReduceOp.PREMUL_SUM (torch.distributed._make_nccl_premul_sum;
// FSDP's gradient divide factor) multiplies each rank's input by its factor into a new buffer, then sums.
#pragma once

#include "torch_compat.h"

#include <utility>
#include <vector>

#include "ddl/ddl.h"

namespace torch_ddl {

// The libddl type that reduces t's elements and how many of them make one of t's (complex: 2).
std::pair<ddlDataType_t, int> reduceTypeOf(const at::Tensor& t);

ddlRedOp_t reduceOpOf(const c10d::ReduceOp& op, const at::Tensor& t);

// ReduceOp.PREMUL_SUM: every rank's input times the factor (a number or a one-element tensor), then summed.
// The inputs are scaled into new buffers: the caller's tensors change only where the result goes.
struct PreMul {
  bool active = false;
  double scalar = 1.0;
  at::Tensor tensor;

  // input times the factor, as a new contiguous tensor on input's device (made on the current stream).
  at::Tensor scaled(const at::Tensor& input) const;
  // input itself when there is no factor, else scaled(input); dense (contiguous) either way.
  at::Tensor apply(const at::Tensor& input) const;
  std::vector<at::Tensor> apply(const std::vector<at::Tensor>& inputs) const;
};

// The factor of op when it is a PREMUL_SUM, else an inactive PreMul.
PreMul preMulOf(const c10d::ReduceOp& op);

}  // namespace torch_ddl
