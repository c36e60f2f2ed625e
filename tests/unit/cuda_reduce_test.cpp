// Tests of the CUDA reductions (comm/cuda/device_reduce.h) against the CPU ones (comm/src/reduce.h).
//
// Each case lays out the same random buffers in host and in device memory, runs reduce() on the CPU and
// ddl::cuda::reduce() on the GPU with the same pointers (offsets and aliasing), and compares the whole
// buffers afterwards, inputs, output and the elements around them, bit for bit: a NaN must be a NaN on both
// sides, but its payload may differ (device_reduce.h says why). Every type and op, odd counts, in place on a
// or b or both, a shared misalignment (the head/tail path) and differing ones (the element-wise path).
// float16 and bfloat16 are also run on every 16-bit pattern. finishAvg likewise.
//
// Everything that needs a GPU skips, with the reason, where cudaGetDeviceCount finds none; the argument
// checks and the pointer queries run everywhere.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "device_reduce.h"
#include "dtype.h"
#include "reduce.h"
#include "cuda_test_util.h"

namespace ddl {
namespace {


#define CUDA_OK(call) \
  ASSERT_EQ((call), cudaSuccess) << #call << ": " << cudaGetErrorString(cudaGetLastError())

struct DeviceBuffer {
  explicit DeviceBuffer(size_t bytes) {
    if (cudaMalloc(&p, bytes) != cudaSuccess) p = nullptr;
  }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  unsigned char* bytes() { return static_cast<unsigned char*>(p); }
  void* p = nullptr;
};

struct Stream {
  Stream() { cudaStreamCreate(&s); }
  ~Stream() { cudaStreamDestroy(s); }
  cudaStream_t s = nullptr;
};

bool isFloatType(ddlDataType_t t) {
  return t == ddlFloat16 || t == ddlBfloat16 || t == ddlFloat32 || t == ddlFloat64;
}

bool isNan(ddlDataType_t t, const unsigned char* p) {
  switch (t) {
    case ddlFloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
    }
    case ddlBfloat16: {
      uint16_t b;
      std::memcpy(&b, p, 2);
      return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0;
    }
    case ddlFloat32: {
      float f;
      std::memcpy(&f, p, 4);
      return std::isnan(f);
    }
    case ddlFloat64: {
      double d;
      std::memcpy(&d, p, 8);
      return std::isnan(d);
    }
    default:
      return false;
  }
}

std::string hex(const unsigned char* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s = "0x";
  for (size_t i = n; i-- > 0;) {  // little-endian: most significant byte last in memory
    s += digits[p[i] >> 4];
    s += digits[p[i] & 15];
  }
  return s;
}

// Element by element; a NaN matches any NaN. Reports the first few differences.
void expectSameElements(ddlDataType_t t, const std::vector<unsigned char>& want,
                        const std::vector<unsigned char>& got, const std::string& what) {
  ASSERT_EQ(want.size(), got.size());
  const size_t es = typeSize(t);
  int bad = 0;
  for (size_t i = 0; i < want.size() / es && bad < 5; ++i) {
    const unsigned char* w = &want[i * es];
    const unsigned char* g = &got[i * es];
    if (std::memcmp(w, g, es) == 0) continue;
    if (isFloatType(t) && isNan(t, w) && isNan(t, g)) continue;
    ++bad;
    ADD_FAILURE() << what << ": element " << i << ": CPU " << hex(w, es) << ", GPU " << hex(g, es);
  }
}

// Random elements: every bit pattern sometimes (NaN, inf, subnormals included), small values and ties often.
void fillRandom(ddlDataType_t t, unsigned char* p, size_t n, std::mt19937_64& rng) {
  const size_t es = typeSize(t);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t r = rng();
    unsigned char* e = p + i * es;
    if (t == ddlFloat16 || t == ddlBfloat16 || r % 4 == 0) {
      std::memcpy(e, &r, es);  // any pattern (for 16-bit floats always: they are few)
    } else if (t == ddlFloat32) {
      const float f = static_cast<float>(static_cast<int64_t>(r >> 40) % 2001 - 1000) / 8.0f;
      std::memcpy(e, &f, 4);
    } else if (t == ddlFloat64) {
      const double d = static_cast<double>(static_cast<int64_t>(r >> 20) % 200001 - 100000) / 64.0;
      std::memcpy(e, &d, 8);
    } else {
      const int64_t v = static_cast<int64_t>(r >> 58) - 32;  // small, both signs
      std::memcpy(e, &v, es);                                // little-endian: the low bytes of v
    }
  }
}

// Where the three operands of a case live, in elements from the start of their buffers, and which of them are
// the same buffer.
enum class Layout {
  kOutOfPlace,
  kIntoA,
  kIntoB,
  kAllSame,
  kSameMisalignment,
  kMixedMisalignment,
  kIntoAMisaligned
};
const char* layoutName(Layout l) {
  const char* names[] = {"out_of_place",      "dst_is_a",           "dst_is_b",           "dst_is_a_is_b",
                         "same_misalignment", "mixed_misalignment", "dst_is_a_misaligned"};
  return names[static_cast<int>(l)];
}

constexpr size_t kSlack = 8;  // elements around every operand, compared too

void runCase(ddlDataType_t type, ddlRedOp_t op, size_t n, Layout layout, uint64_t seed, cudaStream_t stream) {
  SCOPED_TRACE(std::string(typeName(type)) + " " + opName(op) + " n=" + std::to_string(n) + " " +
               layoutName(layout));
  const size_t es = typeSize(type);
  const size_t bytes = (n + 2 * kSlack) * es;
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> host[3];  // a, b, d
  for (auto& h : host) {
    h.resize(bytes);
    fillRandom(type, h.data(), n + 2 * kSlack, rng);
  }
  DeviceBuffer dev[3] = {DeviceBuffer(bytes), DeviceBuffer(bytes), DeviceBuffer(bytes)};
  for (int k = 0; k < 3; ++k) {
    ASSERT_NE(dev[k].p, nullptr);
    CUDA_OK(cudaMemcpy(dev[k].p, host[k].data(), bytes, cudaMemcpyHostToDevice));
  }
  // Offsets (elements) of a, b, d, and which buffer d and b really are.
  size_t off[3] = {kSlack, kSlack, kSlack};
  int buf_b = 1, buf_d = 2;
  switch (layout) {
    case Layout::kIntoA:
      buf_d = 0;
      break;
    case Layout::kIntoB:
      buf_d = 1;
      break;
    case Layout::kAllSame:
      buf_b = buf_d = 0;
      break;
    case Layout::kSameMisalignment:
      off[0] = off[1] = off[2] = kSlack + 1;
      break;
    case Layout::kMixedMisalignment:
      off[0] = kSlack + 1;
      off[2] = kSlack + 2;
      break;
    case Layout::kIntoAMisaligned:
      buf_d = 0;
      off[0] = off[1] = kSlack + 3;
      break;
    default:
      break;
  }
  const size_t off_d = buf_d == 0 ? off[0] : off[2];
  const size_t off_b = buf_b == 0 ? off[0] : off[1];
  reduce(host[buf_d].data() + off_d * es, host[0].data() + off[0] * es, host[buf_b].data() + off_b * es, n,
         type, op);
  ASSERT_EQ(cuda::reduce(dev[buf_d].bytes() + off_d * es, dev[0].bytes() + off[0] * es,
                         dev[buf_b].bytes() + off_b * es, n, type, op, stream),
            cudaSuccess);
  CUDA_OK(cudaStreamSynchronize(stream));
  const char* names[] = {"a", "b", "dst"};
  for (int k = 0; k < 3; ++k) {
    std::vector<unsigned char> got(bytes);
    CUDA_OK(cudaMemcpy(got.data(), dev[k].p, bytes, cudaMemcpyDeviceToHost));
    expectSameElements(type, host[k], got, std::string("buffer ") + names[k]);
  }
}

// ---- without a GPU ----

TEST(CudaDeviceQueries, HostMemoryIsNeverDeviceMemory) {
  int on_stack = 0;
  std::vector<float> on_heap(1000);
  EXPECT_FALSE(cuda::isDevicePointer(&on_stack));
  EXPECT_FALSE(cuda::isDevicePointer(on_heap.data()));
  EXPECT_FALSE(cuda::isDevicePointer(nullptr));
  EXPECT_EQ(cuda::deviceOf(on_heap.data()), -1);
  // libddl's cached count agrees with the runtime asked afresh.
  EXPECT_EQ(cuda::deviceCount() == 0, !test_util::noDeviceReason().empty());
  if (cuda::deviceCount() == 0) return;
  // With a GPU: pinned and managed memory are host-reachable, cudaMalloc'd memory is device memory.
  void* pinned = nullptr;
  void* managed = nullptr;
  DeviceBuffer device(256);
  CUDA_OK(cudaMallocHost(&pinned, 256));
  CUDA_OK(cudaMallocManaged(&managed, 256));
  int current = -1;
  CUDA_OK(cudaGetDevice(&current));
  EXPECT_FALSE(cuda::isDevicePointer(pinned));
  EXPECT_FALSE(cuda::isDevicePointer(managed));
  EXPECT_TRUE(cuda::isDevicePointer(device.p));
  EXPECT_TRUE(cuda::isDevicePointer(device.bytes() + 100));  // inside an allocation
  EXPECT_EQ(cuda::deviceOf(device.p), current);
  cudaFreeHost(pinned);
  cudaFree(managed);
}

// The launchers check their arguments before touching the device, so this runs without one.
TEST(CudaReduceArguments, BadArgumentsAreRefusedBeforeLaunch) {
  auto* base = reinterpret_cast<unsigned char*>(uintptr_t{1} << 40);  // never dereferenced
  void* a = base;
  void* b = base + 4096;
  void* d = base + 8192;
  EXPECT_EQ(cuda::reduce(d, a, b, 0, ddlFloat32, ddlSum, nullptr), cudaSuccess);  // nothing to do
  EXPECT_EQ(cuda::reduce(d, a, b, 4, static_cast<ddlDataType_t>(42), ddlSum, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::reduce(d, a, b, 4, ddlFloat32, static_cast<ddlRedOp_t>(9), nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::reduce(nullptr, a, b, 4, ddlFloat32, ddlSum, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::reduce(base + 8193, a, b, 4, ddlFloat32, ddlSum, nullptr), cudaErrorMisalignedAddress);
  EXPECT_EQ(cuda::reduce(d, base + 1, b, 4, ddlFloat16, ddlSum, nullptr), cudaErrorMisalignedAddress);
  EXPECT_EQ(cuda::reduce(base + 4, a, b, 4, ddlFloat32, ddlSum, nullptr),
            cudaErrorInvalidValue);  // d overlaps a
  EXPECT_EQ(cuda::reduce(d, a, base + 8196, 4, ddlFloat32, ddlSum, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::finishAvg(d, 4, ddlFloat32, 0, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::finishAvg(d, 4, ddlFloat32, 1, nullptr), cudaSuccess);  // dividing by 1: nothing to do
  EXPECT_EQ(cuda::finishAvg(base + 3, 4, ddlInt32, 2, nullptr), cudaErrorMisalignedAddress);
  EXPECT_EQ(cuda::finishAvg(d, 4, static_cast<ddlDataType_t>(-1), 2, nullptr), cudaErrorInvalidValue);
}

// ---- with a GPU ----

class CudaReduceTest : public testing::TestWithParam<std::tuple<ddlDataType_t, ddlRedOp_t>> {};

TEST_P(CudaReduceTest, MatchesTheCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  const auto [type, op] = GetParam();
  Stream stream;
  uint64_t seed = 1000 * type + 10 * op;
  for (size_t n : {size_t{1}, size_t{2}, size_t{3}, size_t{7}, size_t{15}, size_t{16}, size_t{17}, size_t{31},
                   size_t{33}, size_t{255}, size_t{257}, size_t{1000}, size_t{65537}}) {
    for (Layout l : {Layout::kOutOfPlace, Layout::kIntoA, Layout::kIntoB, Layout::kAllSame,
                     Layout::kSameMisalignment, Layout::kMixedMisalignment, Layout::kIntoAMisaligned}) {
      runCase(type, op, n, l, ++seed, stream.s);
      if (HasFailure()) return;
    }
  }
  // Large enough for many rounds of the grid-stride loop on any GPU, plus a partial last round.
  const size_t big = (size_t{12} << 20) / typeSize(type) + 5;
  runCase(type, op, big, Layout::kOutOfPlace, ++seed, stream.s);
  runCase(type, op, big, Layout::kSameMisalignment, ++seed, stream.s);
}

INSTANTIATE_TEST_SUITE_P(AllTypesAndOps, CudaReduceTest,
                         testing::Combine(testing::Values(ddlInt8, ddlUint8, ddlInt32, ddlUint32, ddlInt64,
                                                          ddlUint64, ddlFloat16, ddlBfloat16, ddlFloat32,
                                                          ddlFloat64),
                                          testing::Values(ddlSum, ddlProd, ddlMin, ddlMax, ddlAvg)),
                         [](const auto& info) {
                           return std::string(typeName(std::get<0>(info.param))) + "_" +
                                  opName(std::get<1>(info.param));
                         });
INSTANTIATE_TEST_SUITE_P(BitwiseOnIntegers, CudaReduceTest,
                         testing::Combine(testing::Values(ddlInt8, ddlUint8, ddlInt32, ddlUint32, ddlInt64,
                                                          ddlUint64),
                                          testing::Values(ddlBand, ddlBor, ddlBxor)),
                         [](const auto& info) {
                           return std::string(typeName(std::get<0>(info.param))) + "_" +
                                  opName(std::get<1>(info.param));
                         });

// float16 and bfloat16: every pattern as a, against itself and against three rotations of the patterns as b.
TEST(CudaReduce16, EveryPatternMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  constexpr size_t kN = 65536;
  std::vector<uint16_t> a(kN);
  for (size_t i = 0; i < kN; ++i) a[i] = static_cast<uint16_t>(i);
  DeviceBuffer da(kN * 2), db(kN * 2), dd(kN * 2);
  ASSERT_TRUE(da.p && db.p && dd.p);
  CUDA_OK(cudaMemcpy(da.p, a.data(), kN * 2, cudaMemcpyHostToDevice));
  for (ddlDataType_t type : {ddlFloat16, ddlBfloat16}) {
    for (ddlRedOp_t op : {ddlSum, ddlProd, ddlMin, ddlMax}) {
      for (size_t rot : {size_t{0}, size_t{1}, size_t{12345}, size_t{40000}}) {
        SCOPED_TRACE(std::string(typeName(type)) + " " + opName(op) + " rotation " + std::to_string(rot));
        std::vector<uint16_t> b(kN), want(kN), got(kN);
        for (size_t i = 0; i < kN; ++i) b[i] = a[(i + rot) % kN];
        CUDA_OK(cudaMemcpy(db.p, b.data(), kN * 2, cudaMemcpyHostToDevice));
        reduce(want.data(), a.data(), b.data(), kN, type, op);
        ASSERT_EQ(cuda::reduce(dd.p, da.p, db.p, kN, type, op, nullptr), cudaSuccess);
        CUDA_OK(cudaMemcpy(got.data(), dd.p, kN * 2, cudaMemcpyDeviceToHost));
        std::vector<unsigned char> w(kN * 2), g(kN * 2);
        std::memcpy(w.data(), want.data(), kN * 2);
        std::memcpy(g.data(), got.data(), kN * 2);
        expectSameElements(type, w, g, "result");
      }
    }
  }
}

class CudaFinishAvgTest : public testing::TestWithParam<ddlDataType_t> {};

TEST_P(CudaFinishAvgTest, MatchesTheCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  const ddlDataType_t type = GetParam();
  const size_t es = typeSize(type);
  Stream stream;
  std::mt19937_64 rng(7 + type);
  for (int nranks : {2, 3, 7, 8, 1000, 32768}) {
    for (size_t n : {size_t{1}, size_t{17}, size_t{1000}, size_t{65537}, size_t{3000001}}) {
      for (size_t off : {size_t{0}, size_t{1}}) {
        SCOPED_TRACE(std::string(typeName(type)) + " nranks=" + std::to_string(nranks) +
                     " n=" + std::to_string(n) + " offset=" + std::to_string(off));
        const size_t bytes = (n + 2 * kSlack) * es;
        std::vector<unsigned char> host(bytes), got(bytes);
        fillRandom(type, host.data(), n + 2 * kSlack, rng);
        DeviceBuffer dev(bytes);
        ASSERT_NE(dev.p, nullptr);
        CUDA_OK(cudaMemcpy(dev.p, host.data(), bytes, cudaMemcpyHostToDevice));
        finishAvg(host.data() + (kSlack + off) * es, n, type, nranks);
        ASSERT_EQ(cuda::finishAvg(dev.bytes() + (kSlack + off) * es, n, type, nranks, stream.s), cudaSuccess);
        CUDA_OK(cudaStreamSynchronize(stream.s));
        CUDA_OK(cudaMemcpy(got.data(), dev.p, bytes, cudaMemcpyDeviceToHost));
        expectSameElements(type, host, got, "buffer");
        if (HasFailure()) return;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, CudaFinishAvgTest,
                         testing::Values(ddlInt8, ddlUint8, ddlInt32, ddlUint32, ddlInt64, ddlUint64,
                                         ddlFloat16, ddlBfloat16, ddlFloat32, ddlFloat64),
                         [](const auto& info) { return std::string(typeName(info.param)); });

}  // namespace
}  // namespace ddl
