// collectives.cpp: ProcessGroupDDL's collectives (all but point-to-point), each built as a Call: its
// argument checks (at the call, raising ValueError), its host body (on the worker, through host memory where
// libddl takes no device memory for it: staged.h) and, where libddl has a stream-ordered form, its stream body
// (run with the group's stream current, so that the contiguous copies and slices it makes are ordered on that
// stream too: stream_ordered.cpp). submit() picks the path. The coalesced forms (torch >= 2.0) combine the
// Calls of their parts into one Work.
#include "process_group_ddl.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

#include "arguments.h"
#include "reduce_ops.h"
#include "staged.h"

namespace torch_ddl {

namespace {

// A contiguous tensor with t's data (t itself when it is one); made on the current stream.
at::Tensor dense(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

// The bytes of flat (uint8) from offset on, as a tensor shaped like `like` (for copying into it).
at::Tensor bytesAs(const at::Tensor& flat, size_t offset, const at::Tensor& like) {
  at::Tensor bytes = flat.narrow(0, static_cast<int64_t>(offset), static_cast<int64_t>(like.nbytes()));
  return bytes.view(like.scalar_type()).view(like.sizes());
}

// tensors laid end to end as bytes, in one new tensor on their device (the current stream's copies).
at::Tensor catBytes(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flat;
  for (const auto& t : tensors) flat.push_back(dense(t).view({-1}).view(at::kByte));
  return at::cat(flat);
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::allreduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceOptions& opts) {
  at::Tensor t = single(tensors, "all_reduce");
  if (t.is_sparse()) return submit(c10d::OpType::ALLREDUCE, "ddl:all_reduce_sparse", sparseAllreduce(t, opts));
  const auto [type, factor] = reduceTypeOf(t);
  const ddlRedOp_t op = reduceOpOf(opts.reduceOp, t);
  const PreMul pre = preMulOf(opts.reduceOp);
  Call call{{t}, {t}};
  call.host = [this, t, type = type, factor = factor, op, pre] {
    Staged s = stage(t, /*device_ok=*/kLibddlTakesDeviceBuffers, /*read_input=*/true);
    if (pre.active) {
      s.buf = pre.scaled(s.buf);
      s.copy_back = true;
      syncDevice(s.buf);  // libddl's blocking device path reads it now
    }
    check(ddlAllReduce(s.buf.data_ptr(), s.buf.data_ptr(), s.buf.numel() * factor, type, op, comm_), "all_reduce");
    unstage(s);
  };
  call.stream = [this, t, type = type, factor = factor, op, pre](ddlStream_t stream) mutable {
    at::Tensor buf = pre.apply(t);
#if TORCH_DDL_STREAM_ORDERED
    noteHot(buf, stream);  // DDP's buckets: registered once hot, then zero-copy
#endif
    check(ddlAllReduceOnStream(buf.data_ptr(), buf.data_ptr(), buf.numel() * factor, type, op, comm_, stream),
          "all_reduce");
    if (!buf.is_same(t)) t.copy_(buf);
  };
  return submit(c10d::OpType::ALLREDUCE, "ddl:all_reduce", std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                    const c10d::AllreduceCoalescedOptions& opts) {
  if (tensors.empty()) refuse("allreduce_coalesced needs at least one tensor");
  for (const auto& t : tensors) {
    if (t.scalar_type() != tensors[0].scalar_type() || t.device() != tensors[0].device()) {
      refuse("allreduce_coalesced takes tensors of one dtype and device");
    }
  }
  const auto [type, factor] = reduceTypeOf(tensors[0]);
  const ddlRedOp_t op = reduceOpOf(opts.reduceOp, tensors[0]);
  const PreMul pre = preMulOf(opts.reduceOp);
  std::vector<at::Tensor> ts = tensors;
  const size_t elem = ts[0].element_size();
  Call call{ts, ts};
  call.host = [this, ts, type = type, factor = factor, op, elem, pre]() mutable {
    std::vector<size_t> offsets;
    at::Tensor flat = flatBytes(pre.apply(ts), &offsets);
    check(ddlAllReduce(flat.data_ptr(), flat.data_ptr(), flat.nbytes() / elem * factor, type, op, comm_),
          "all_reduce_coalesced");
    for (size_t i = 0; i < ts.size(); ++i) copyOut(ts[i], flat, offsets[i]);
  };
  call.stream = [this, ts, type = type, factor = factor, op, elem, pre](ddlStream_t stream) mutable {
    at::Tensor flat = catBytes(pre.apply(ts));
    check(ddlAllReduceOnStream(flat.data_ptr(), flat.data_ptr(), flat.nbytes() / elem * factor, type, op, comm_,
                               stream),
          "all_reduce_coalesced");
    size_t offset = 0;
    for (auto& t : ts) {
      t.copy_(bytesAs(flat, offset, t));
      offset += t.nbytes();
    }
  };
  return submit(c10d::OpType::ALLREDUCE_COALESCED, "ddl:all_reduce_coalesced", std::move(call));
}

// Sparse all_reduce, as gloo does it: the ranks gather each other's shape and number of entries, then every
// rank's indices and values (padded to the largest count, so that one allgather moves each), add the sparse
// tensors up and coalesce the sum into the caller's tensor. Moves p * max(nnz) entries to every rank; SUM only.
Call ProcessGroupDDL::sparseAllreduce(const at::Tensor& tensor, const c10d::AllreduceOptions& opts) {
  if (opts.reduceOp != c10d::ReduceOp::SUM) refuse("sparse all_reduce takes ReduceOp.SUM only");
  at::Tensor t = tensor;
  Call call{{t}, {t}};
  call.host = [this, t]() mutable {
    const char* what = "all_reduce (sparse)";
    at::Tensor input = t.to(at::kCPU).coalesce();
    const int64_t ndim = input.dim(), sparse_dim = input.sparse_dim(), nnz = input._nnz();
    // Shapes: every rank must hold a tensor of the same sizes (checked on every rank alike: all raise).
    std::vector<int64_t> meta{ndim, sparse_dim, nnz}, all_meta(3 * size_);
    check(ddlAllGather(meta.data(), all_meta.data(), 3, ddlInt64, comm_), what);
    int64_t max_nnz = 0;
    for (int r = 0; r < size_; ++r) {
      if (all_meta[3 * r] != ndim || all_meta[3 * r + 1] != sparse_dim) {
        throw std::runtime_error("ddl: sparse all_reduce: rank " + std::to_string(r) + " has a tensor of " +
                                 std::to_string(all_meta[3 * r]) + " dimensions (" +
                                 std::to_string(all_meta[3 * r + 1]) + " sparse), rank " + std::to_string(rank_) +
                                 " one of " + std::to_string(ndim) + " (" + std::to_string(sparse_dim) + " sparse)");
      }
      max_nnz = std::max(max_nnz, all_meta[3 * r + 2]);
    }
    std::vector<int64_t> sizes = input.sizes().vec(), all_sizes(ndim * size_);
    check(ddlAllGather(sizes.data(), all_sizes.data(), ndim, ddlInt64, comm_), what);
    for (int r = 0; r < size_; ++r) {
      if (!std::equal(sizes.begin(), sizes.end(), all_sizes.begin() + r * ndim)) {
        throw std::runtime_error("ddl: sparse all_reduce: rank " + std::to_string(r) +
                                 "'s tensor has other sizes than rank " + std::to_string(rank_) + "'s");
      }
    }
    // Indices and values, each rank's padded to max_nnz entries.
    const auto long_options = at::TensorOptions().dtype(at::kLong);
    at::Tensor indices = at::zeros({sparse_dim, max_nnz}, long_options);
    indices.narrow(1, 0, nnz).copy_(input._indices());
    std::vector<int64_t> value_shape = input._values().sizes().vec();
    value_shape[0] = max_nnz;
    at::Tensor values = at::zeros(value_shape, input._values().options());
    values.narrow(0, 0, nnz).copy_(input._values());
    std::vector<int64_t> all_value_shape = value_shape;
    all_value_shape.insert(all_value_shape.begin(), size_);
    at::Tensor all_indices = at::empty({size_, sparse_dim, max_nnz}, long_options);
    at::Tensor all_values = at::empty(all_value_shape, values.options());
    check(ddlAllGather(indices.data_ptr(), all_indices.data_ptr(), indices.numel(), ddlInt64, comm_), what);
    check(ddlAllGather(values.data_ptr(), all_values.data_ptr(), values.nbytes(), ddlUint8, comm_), what);
    at::Tensor sum;
    for (int r = 0; r < size_; ++r) {
      const int64_t n = all_meta[3 * r + 2];
      at::Tensor part = at::sparse_coo_tensor(all_indices[r].narrow(1, 0, n), all_values[r].narrow(0, 0, n),
                                              sizes, input.options());
      sum = r == 0 ? part : sum + part;
    }
    t.copy_(sum.coalesce());  // copy_ of a sparse tensor takes the sum's indices and values
  };
  return call;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::broadcast(std::vector<at::Tensor>& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  at::Tensor t = single(tensors, "broadcast");
  const int root = static_cast<int>(opts.rootRank);
  Call call{{t}, {t}};
  call.host = [this, t, root] {
    Staged s = stage(t, /*device_ok=*/false, /*read_input=*/rank_ == root);
    check(ddlBroadcast(s.buf.data_ptr(), s.buf.data_ptr(), s.buf.nbytes(), ddlUint8, root, comm_), "broadcast");
    unstage(s);
  };
  call.stream = [this, t, root](ddlStream_t stream) mutable {
    at::Tensor buf = dense(t);
    check(ddlBroadcastOnStream(buf.data_ptr(), buf.data_ptr(), buf.nbytes(), ddlUint8, root, comm_, stream),
          "broadcast");
    if (!buf.is_same(t)) t.copy_(buf);
  };
  return submit(c10d::OpType::BROADCAST, "ddl:broadcast", std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::reduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::ReduceOptions& opts) {
  at::Tensor t = single(tensors, "reduce");
  const auto [type, factor] = reduceTypeOf(t);
  const ddlRedOp_t op = reduceOpOf(opts.reduceOp, t);
  const PreMul pre = preMulOf(opts.reduceOp);
  const int root = static_cast<int>(opts.rootRank);
  Call call{{t}, {t}};
  call.host = [this, t, type = type, factor = factor, op, root, pre] {
    Staged s = stage(t, /*device_ok=*/false, /*read_input=*/true);
    if (pre.active) {
      s.buf = pre.scaled(s.buf);
      s.copy_back = true;
    }
    check(ddlReduce(s.buf.data_ptr(), rank_ == root ? s.buf.data_ptr() : nullptr, s.buf.numel() * factor, type, op,
                    root, comm_),
          "reduce");
    if (rank_ == root) unstage(s);
  };
  call.stream = [this, t, type = type, factor = factor, op, root, pre](ddlStream_t stream) mutable {
    at::Tensor buf = pre.apply(t);
    check(ddlReduceOnStream(buf.data_ptr(), rank_ == root ? buf.data_ptr() : nullptr, buf.numel() * factor, type,
                            op, root, comm_, stream),
          "reduce");
    if (rank_ == root && !buf.is_same(t)) t.copy_(buf);
  };
  return submit(c10d::OpType::REDUCE, "ddl:reduce", std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllgatherOptions& opts) {
  at::Tensor in = single(inputs, "all_gather");
  std::vector<at::Tensor> outs = groupList(outputs, size_, "all_gather", "output");
  checkSameBytes(outs, in.nbytes(), "all_gather");
  Call call{{in}, outs};
  call.host = [this, in, outs]() mutable {
    at::Tensor src = in.to(at::kCPU).contiguous();
    at::Tensor flat = at::empty({static_cast<int64_t>(src.nbytes() * size_)}, at::TensorOptions().dtype(at::kByte));
    check(ddlAllGather(src.data_ptr(), flat.data_ptr(), src.nbytes(), ddlUint8, comm_), "all_gather");
    for (int r = 0; r < size_; ++r) copyOut(outs[r], flat, r * src.nbytes());
  };
  call.stream = [this, in, outs](ddlStream_t stream) mutable {
    at::Tensor src = dense(in);
    at::Tensor flat = at::empty({static_cast<int64_t>(src.nbytes() * size_)}, src.options().dtype(at::kByte));
    check(ddlAllGatherOnStream(src.data_ptr(), flat.data_ptr(), src.nbytes(), ddlUint8, comm_, stream), "all_gather");
    for (int r = 0; r < size_; ++r) outs[r].copy_(bytesAs(flat, r * src.nbytes(), outs[r]));
  };
  return submit(c10d::OpType::ALLGATHER, "ddl:all_gather", std::move(call));
}

Call ProcessGroupDDL::allgatherIntoTensor(const at::Tensor& output, const at::Tensor& input, const char* what) {
  if (output.nbytes() != input.nbytes() * size_) {
    refuse(std::string(what) + ": the output must hold the group's size (" + std::to_string(size_) +
           ") times the input's " + std::to_string(input.nbytes()) + " bytes, it has " +
           std::to_string(output.nbytes()));
  }
  if (output.scalar_type() != input.scalar_type()) refuse(std::string(what) + ": input and output dtypes differ");
  at::Tensor in = input, out = output;
  Call call{{in}, {out}};
  call.host = [this, in, out, what] {
    at::Tensor src = in.to(at::kCPU).contiguous();
    Staged s = stage(out, /*device_ok=*/false, /*read_input=*/false);
    check(ddlAllGather(src.data_ptr(), s.buf.data_ptr(), src.nbytes(), ddlUint8, comm_), what);
    unstage(s);
  };
  call.stream = [this, in, out, what](ddlStream_t stream) mutable {
    at::Tensor src = dense(in);
    at::Tensor dst = out.is_contiguous() ? out : at::empty_like(out, at::MemoryFormat::Contiguous);
    check(ddlAllGatherOnStream(src.data_ptr(), dst.data_ptr(), src.nbytes(), ddlUint8, comm_, stream), what);
    if (!dst.is_same(out)) out.copy_(dst);
  };
  return call;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                const c10d::AllgatherOptions& opts) {
  return submit(c10d::OpType::_ALLGATHER_BASE, "ddl:_all_gather_base",
                allgatherIntoTensor(output, input, "_allgather_base"));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::GatherOptions& opts) {
  at::Tensor in = single(inputs, "gather");
  const int root = static_cast<int>(opts.rootRank);
  std::vector<at::Tensor> outs = rootList(outputs, size_, rank_, root, "gather", "output");
  checkSameBytes(outs, in.nbytes(), "gather");
  Call call{{in}, outs};
  call.host = [this, in, outs, root]() mutable {
    at::Tensor src = in.to(at::kCPU).contiguous();
    at::Tensor flat;
    if (rank_ == root) flat = at::empty({static_cast<int64_t>(src.nbytes() * size_)}, at::TensorOptions().dtype(at::kByte));
    check(ddlGather(src.data_ptr(), rank_ == root ? flat.data_ptr() : nullptr, src.nbytes(), ddlUint8, root, comm_),
          "gather");
    for (int r = 0; r < static_cast<int>(outs.size()); ++r) copyOut(outs[r], flat, r * src.nbytes());
  };
  return submit(c10d::OpType::GATHER, "ddl:gather", std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::scatter(std::vector<at::Tensor>& outputs,
                                                        std::vector<std::vector<at::Tensor>>& inputs,
                                                        const c10d::ScatterOptions& opts) {
  at::Tensor out = single(outputs, "scatter");
  const int root = static_cast<int>(opts.rootRank);
  std::vector<at::Tensor> ins = rootList(inputs, size_, rank_, root, "scatter", "input");
  checkSameBytes(ins, out.nbytes(), "scatter");
  Call call{ins, {out}};
  call.host = [this, ins, out, root] {
    std::vector<size_t> offsets;
    at::Tensor flat = rank_ == root ? flatBytes(ins, &offsets) : at::Tensor();
    Staged s = stage(out, /*device_ok=*/false, /*read_input=*/false);
    check(ddlScatter(rank_ == root ? flat.data_ptr() : nullptr, s.buf.data_ptr(), s.buf.nbytes(), ddlUint8, root,
                     comm_),
          "scatter");
    unstage(s);
  };
  return submit(c10d::OpType::SCATTER, "ddl:scatter", std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                               std::vector<std::vector<at::Tensor>>& inputs,
                                                               const c10d::ReduceScatterOptions& opts) {
  at::Tensor out = single(outputs, "reduce_scatter");
  std::vector<at::Tensor> ins = groupList(inputs, size_, "reduce_scatter", "input");
  checkSameBytes(ins, out.nbytes(), "reduce_scatter");
  for (const auto& t : ins) {
    if (t.scalar_type() != out.scalar_type()) refuse("reduce_scatter: input and output dtypes differ");
  }
  const auto [type, factor] = reduceTypeOf(out);
  const ddlRedOp_t op = reduceOpOf(opts.reduceOp, out);
  const PreMul pre = preMulOf(opts.reduceOp);
  Call call{ins, {out}};
  call.host = [this, ins, out, type = type, factor = factor, op, pre] {
    std::vector<size_t> offsets;
    at::Tensor flat = flatBytes(pre.apply(ins), &offsets);
    Staged s = stage(out, /*device_ok=*/false, /*read_input=*/false);
    check(ddlReduceScatter(flat.data_ptr(), s.buf.data_ptr(), s.buf.numel() * factor, type, op, comm_),
          "reduce_scatter");
    unstage(s);
  };
  call.stream = [this, ins, out, type = type, factor = factor, op, pre](ddlStream_t stream) mutable {
    at::Tensor flat = catBytes(pre.apply(ins));
    at::Tensor dst = out.is_contiguous() ? out : at::empty_like(out, at::MemoryFormat::Contiguous);
    check(ddlReduceScatterOnStream(flat.data_ptr(), dst.data_ptr(), dst.numel() * factor, type, op, comm_, stream),
          "reduce_scatter");
    if (!dst.is_same(out)) out.copy_(dst);
  };
  return submit(c10d::OpType::REDUCE_SCATTER, "ddl:reduce_scatter", std::move(call));
}

Call ProcessGroupDDL::reduceScatterTensor(const at::Tensor& output, const at::Tensor& input,
                                          const c10d::ReduceOp& reduce_op, const char* what) {
  if (input.nbytes() != output.nbytes() * size_) {
    refuse(std::string(what) + ": the input must hold the group's size (" + std::to_string(size_) +
           ") times the output's " + std::to_string(output.nbytes()) + " bytes, it has " +
           std::to_string(input.nbytes()));
  }
  if (output.scalar_type() != input.scalar_type()) refuse(std::string(what) + ": input and output dtypes differ");
  const auto [type, factor] = reduceTypeOf(output);
  const ddlRedOp_t op = reduceOpOf(reduce_op, output);
  const PreMul pre = preMulOf(reduce_op);
  at::Tensor in = input, out = output;
  Call call{{in}, {out}};
  call.host = [this, in, out, type = type, factor = factor, op, what, pre] {
    at::Tensor src = pre.apply(in.to(at::kCPU));
    Staged s = stage(out, /*device_ok=*/false, /*read_input=*/false);
    check(ddlReduceScatter(src.data_ptr(), s.buf.data_ptr(), s.buf.numel() * factor, type, op, comm_), what);
    unstage(s);
  };
  call.stream = [this, in, out, type = type, factor = factor, op, what, pre](ddlStream_t stream) mutable {
    at::Tensor src = pre.apply(in);
    at::Tensor dst = out.is_contiguous() ? out : at::empty_like(out, at::MemoryFormat::Contiguous);
    check(ddlReduceScatterOnStream(src.data_ptr(), dst.data_ptr(), dst.numel() * factor, type, op, comm_, stream),
          what);
    if (!dst.is_same(out)) out.copy_(dst);
  };
  return call;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                     const c10d::ReduceScatterOptions& opts) {
  return submit(c10d::OpType::_REDUCE_SCATTER_BASE, "ddl:_reduce_scatter_base",
                reduceScatterTensor(output, input, opts.reduceOp, "_reduce_scatter_base"));
}

Call ProcessGroupDDL::combine(std::vector<Call> calls) {
  Call all;
  bool stream = true;
  std::vector<std::function<void()>> hosts;
  std::vector<std::function<void(ddlStream_t)>> streams;
  for (auto& c : calls) {
    all.inputs.insert(all.inputs.end(), c.inputs.begin(), c.inputs.end());
    all.outputs.insert(all.outputs.end(), c.outputs.begin(), c.outputs.end());
    hosts.push_back(std::move(c.host));
    stream = stream && c.stream;
    streams.push_back(std::move(c.stream));
  }
  all.host = [hosts] {
    for (const auto& h : hosts) h();
  };
  if (stream) {
    all.stream = [streams](ddlStream_t s) {
      for (const auto& f : streams) f(s);
    };
  }
  return all;
}

#if TORCH_DDL_BACKEND
c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                    std::vector<at::Tensor>& inputs,
                                                                    const c10d::AllgatherOptions& opts) {
  // torch's order: outputs[r][i] receives rank r's inputs[i].
  if (outputs.size() != static_cast<size_t>(size_)) {
    refuse("all_gather_coalesced needs one output list per rank (" + std::to_string(size_) + "), got " +
           std::to_string(outputs.size()));
  }
  for (size_t r = 0; r < outputs.size(); ++r) {
    if (outputs[r].size() != inputs.size()) {
      refuse("all_gather_coalesced: the output list of rank " + std::to_string(r) + " has " +
             std::to_string(outputs[r].size()) + " tensors, one per input (" + std::to_string(inputs.size()) +
             ") is needed");
    }
  }
  // Each input's gather into a flat buffer, then copied into every rank's list: as allgather, per input.
  std::vector<Call> calls;
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<at::Tensor> outs;
    for (const auto& list : outputs) outs.push_back(list[i]);
    checkSameBytes(outs, inputs[i].nbytes(), "all_gather_coalesced");
    at::Tensor in = inputs[i];
    const auto options = in.options().dtype(at::kByte);
    at::Tensor flat = at::empty({static_cast<int64_t>(in.nbytes() * size_)}, options);
    Call c = allgatherIntoTensor(flat, in.view({-1}).view(at::kByte), "allgather_coalesced");
    auto copy_out = [outs, flat, n = in.nbytes()]() mutable {
      for (size_t r = 0; r < outs.size(); ++r) outs[r].copy_(bytesAs(flat, r * n, outs[r]));
    };
    c.host = [body = std::move(c.host), copy_out, outs]() mutable {
      body();
      copy_out();
      for (const auto& t : outs) syncDevice(t);
    };
    c.stream = [body = std::move(c.stream), copy_out](ddlStream_t s) mutable {
      body(s);
      copy_out();
    };
    c.outputs.insert(c.outputs.end(), outs.begin(), outs.end());
    calls.push_back(std::move(c));
  }
  return submit(c10d::OpType::ALLGATHER_COALESCED, "ddl:allgather_coalesced", combine(std::move(calls)));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                std::vector<at::Tensor>& inputs,
                                                                                const c10d::AllgatherOptions& opts) {
  if (outputs.size() != inputs.size()) refuse("allgather_into_tensor_coalesced needs one output per input");
  std::vector<Call> calls;
  for (size_t i = 0; i < inputs.size(); ++i) {
    calls.push_back(allgatherIntoTensor(outputs[i], inputs[i], "allgather_into_tensor_coalesced"));
  }
  return submit(c10d::OpType::COALESCED, "ddl:allgather_into_tensor_coalesced", combine(std::move(calls)));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  if (outputs.size() != inputs.size()) refuse("reduce_scatter_tensor_coalesced needs one output per input");
  std::vector<Call> calls;
  for (size_t i = 0; i < inputs.size(); ++i) {
    calls.push_back(reduceScatterTensor(outputs[i], inputs[i], opts.reduceOp, "reduce_scatter_tensor_coalesced"));
  }
  return submit(c10d::OpType::COALESCED, "ddl:reduce_scatter_tensor_coalesced", combine(std::move(calls)));
}
#endif

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                              std::vector<int64_t>& output_split_sizes,
                                                              std::vector<int64_t>& input_split_sizes,
                                                              const c10d::AllToAllOptions& opts) {
  // Splits count rows (dim 0); no splits: equal parts.
  auto counts = [&](const at::Tensor& t, const std::vector<int64_t>& splits, const char* which) {
    const int64_t rows = t.dim() > 0 ? t.size(0) : 1;
    const size_t row_bytes = rows > 0 ? t.nbytes() / rows : 0;
    std::vector<size_t> bytes(size_), displs(size_);
    if (splits.empty()) {
      if (rows % size_ != 0) {
        refuse(std::string("all_to_all_single: the ") + which + "'s first dimension (" + std::to_string(rows) +
               ") does not split evenly over " + std::to_string(size_) + " ranks: pass split sizes");
      }
      std::fill(bytes.begin(), bytes.end(), rows / size_ * row_bytes);
    } else {
      if (splits.size() != static_cast<size_t>(size_) ||
          std::accumulate(splits.begin(), splits.end(), int64_t{0}) != rows) {
        refuse(std::string("all_to_all_single: the ") + which + " split sizes must be " + std::to_string(size_) +
               " numbers adding up to the first dimension (" + std::to_string(rows) + ")");
      }
      for (int r = 0; r < size_; ++r) bytes[r] = static_cast<size_t>(splits[r]) * row_bytes;
    }
    for (int r = 1; r < size_; ++r) displs[r] = displs[r - 1] + bytes[r - 1];
    return std::make_pair(bytes, displs);
  };
  if (output.scalar_type() != input.scalar_type()) refuse("all_to_all_single: input and output dtypes differ");
  auto [sc, sd] = counts(input, input_split_sizes, "input");
  auto [rc, rd] = counts(output, output_split_sizes, "output");
  at::Tensor in = input, out = output;
  Call call{{in}, {out}};
  call.host = [this, in, out, sc = sc, sd = sd, rc = rc, rd = rd] {
                   at::Tensor src = in.to(at::kCPU).contiguous();
                   Staged s = stage(out, /*device_ok=*/false, /*read_input=*/false);
                   check(ddlAllToAllv(src.data_ptr(), sc.data(), sd.data(), s.buf.data_ptr(), rc.data(), rd.data(),
                                      ddlUint8, comm_),
                         "all_to_all_single");
                   unstage(s);
  };
  return submit(c10d::OpType::ALLTOALL_BASE, "ddl:all_to_all", std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllToAllOptions& opts) {
  if (outputs.size() != static_cast<size_t>(size_) || inputs.size() != static_cast<size_t>(size_)) {
    refuse("all_to_all needs " + std::to_string(size_) + " input and " + std::to_string(size_) +
           " output tensors (the group's size)");
  }
  std::vector<at::Tensor> ins = inputs, outs = outputs;
  Call call{ins, outs};
  call.host = [this, ins, outs]() mutable {
    std::vector<size_t> sd, rd, sc, rc;
    at::Tensor src = flatBytes(ins, &sd);
    size_t total = 0;
    for (const auto& t : outs) {
      rd.push_back(total);
      rc.push_back(t.nbytes());
      total += t.nbytes();
    }
    for (const auto& t : ins) sc.push_back(t.nbytes());
    at::Tensor dst = at::empty({static_cast<int64_t>(total)}, at::TensorOptions().dtype(at::kByte));
    check(ddlAllToAllv(src.data_ptr(), sc.data(), sd.data(), dst.data_ptr(), rc.data(), rd.data(), ddlUint8, comm_),
          "all_to_all");
    for (int r = 0; r < size_; ++r) copyOut(outs[r], dst, rd[r]);
  };
  return submit(c10d::OpType::ALLTOALL, "ddl:all_to_all", std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::barrier(const c10d::BarrierOptions& opts) {
  Call call;
  call.host = [this] { check(ddlBarrier(comm_), "barrier"); };
  return submit(c10d::OpType::BARRIER, "ddl:barrier", std::move(call));
}

}  // namespace torch_ddl
