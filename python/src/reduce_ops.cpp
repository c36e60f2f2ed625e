// reduce_ops.cpp: torch's dtypes and ReduceOps as libddl's (reduce_ops.h).
#include "reduce_ops.h"

#include <string>

#include "arguments.h"

namespace torch_ddl {

std::pair<ddlDataType_t, int> reduceTypeOf(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kByte: return {ddlUint8, 1};
    case at::kBool: return {ddlUint8, 1};
    case at::kChar: return {ddlInt8, 1};
    case at::kInt: return {ddlInt32, 1};
    case at::kLong: return {ddlInt64, 1};
    case at::kHalf: return {ddlFloat16, 1};
    case at::kBFloat16: return {ddlBfloat16, 1};
    case at::kFloat: return {ddlFloat32, 1};
    case at::kDouble: return {ddlFloat64, 1};
    case at::kComplexHalf: return {ddlFloat16, 2};
    case at::kComplexFloat: return {ddlFloat32, 2};
    case at::kComplexDouble: return {ddlFloat64, 2};
    default:
      refuse(std::string("cannot reduce tensors of dtype ") + c10::toString(t.scalar_type()) +
             " (reductions take bool, uint8, int8, int32, int64, float16, bfloat16, float32, float64 and complex; "
             "broadcast, gathers, scatters, all_to_all and send/recv take every dtype)");
  }
}

ddlRedOp_t reduceOpOf(const c10d::ReduceOp& op, const at::Tensor& t) {
  const bool is_bool = t.scalar_type() == at::kBool;
  const bool is_complex = t.is_complex();
  const bool is_integral = at::isIntegralType(t.scalar_type(), /*includeBool=*/true);
  auto name = [&] { return std::string(c10::toString(t.scalar_type())); };
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return is_bool ? ddlMax : ddlSum;  // a logical or, as NCCL does
    case c10d::ReduceOp::AVG:
      if (is_bool) refuse("ReduceOp.AVG is not defined on bool tensors");
      return ddlAvg;
    case c10d::ReduceOp::PRODUCT:
      if (is_complex) refuse("ReduceOp.PRODUCT on complex tensors is not supported (SUM and AVG are)");
      return is_bool ? ddlMin : ddlProd;  // a logical and
    case c10d::ReduceOp::MIN:
    case c10d::ReduceOp::MAX:
      if (is_complex) refuse("complex tensors have no order: ReduceOp.MIN and MAX do not apply");
      return op.op_ == c10d::ReduceOp::MIN ? ddlMin : ddlMax;
    case c10d::ReduceOp::BAND:
    case c10d::ReduceOp::BOR:
    case c10d::ReduceOp::BXOR:
      if (!is_integral) refuse("bitwise reductions take integer and bool tensors, not " + name());
      return op.op_ == c10d::ReduceOp::BAND ? ddlBand : op.op_ == c10d::ReduceOp::BOR ? ddlBor : ddlBxor;
    case c10d::ReduceOp::PREMUL_SUM:
      if (!at::isFloatingType(t.scalar_type()) && !is_complex) {
        refuse("ReduceOp.PREMUL_SUM takes floating-point and complex tensors, not " + name());
      }
      return ddlSum;  // of the inputs times the factor (PreMul)
    default:
      refuse("ReduceOp " + std::to_string(static_cast<int>(op.op_)) +
             " is not supported (use SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR or PREMUL_SUM)");
  }
}

at::Tensor PreMul::scaled(const at::Tensor& input) const {
  if (tensor.defined()) return input.mul(tensor.to(input.device(), input.scalar_type())).contiguous();
  return input.mul(scalar).contiguous();
}

at::Tensor PreMul::apply(const at::Tensor& input) const {
  return active ? scaled(input) : input.is_contiguous() ? input : input.contiguous();
}

std::vector<at::Tensor> PreMul::apply(const std::vector<at::Tensor>& inputs) const {
  if (!active) return inputs;
  std::vector<at::Tensor> out;
  for (const auto& t : inputs) out.push_back(scaled(t));
  return out;
}

PreMul preMulOf(const c10d::ReduceOp& op) {
  PreMul p;
  if (op.op_ != c10d::ReduceOp::PREMUL_SUM) return p;
  // torch makes PREMUL_SUM only with this supplement (_make_nccl_premul_sum).
  const auto* s = static_cast<const c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
  if (!s) refuse("ReduceOp.PREMUL_SUM without its factor: make it with torch.distributed._make_nccl_premul_sum");
  p.active = true;
  p.tensor = premulFactorTensor(*s);
  if (p.tensor.defined() && p.tensor.numel() != 1) {
    refuse("ReduceOp.PREMUL_SUM: the factor tensor must have one element, it has " +
           std::to_string(p.tensor.numel()));
  }
  p.scalar = s->double_factor;
  return p;
}

}  // namespace torch_ddl
