// ddl-cuda-bench: libddl's CUDA reduction kernel against the device's own copy bandwidth.
//
// A reduction of two buffers into a third reads two bytes and writes one for every byte of an operand, so the
// fastest it can go is the speed at which the device moves memory: the yardstick here is cudaMemcpy device to
// device on the same GPU, which reads one byte and writes one. For each size S (the bytes of one operand,
// 64 MiB to 1 GiB by default) it times on one stream, with CUDA events:
//   reduce     dst = a (op) b, three distinct buffers      effective bandwidth 3·S / time
//   inplace    a = a (op) b                                  3·S / time
//   copy       cudaMemcpyAsync(dst, a, S, device to device)  2·S / time
// and prints the medians of -n iterations (after -w warm-ups) and ratio = reduce / copy bandwidth. The goal
// for float32 sum on large buffers is a ratio of at least 0.85. Results are checked on a sample of elements
// (the operands are memset to byte patterns; the expected element comes from the CPU reduction).
//
// Exit status: 0 measured, 1 a wrong result or a CUDA error, 2 bad usage, 77 no CUDA device (nothing to
// measure: the message says why).
#include <cuda_runtime_api.h>
#include <getopt.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_common.h"  // flag parsing shared with ddl-bench
#include "device_reduce.h"
#include "dtype.h"
#include "reduce.h"

namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;
constexpr int kExitNoDevice = 77;
constexpr double kGoal = 0.85;

struct Options {
  size_t min_bytes = size_t{64} << 20;
  size_t max_bytes = size_t{1} << 30;
  int factor = 2;
  int iters = 20;
  int warmup = 5;
  int device = 0;
  ddlDataType_t type = ddlFloat32;
  ddlRedOp_t op = ddlSum;
  std::string json_path;
};

[[noreturn]] void usage(int status) {
  std::fprintf(
      status == 0 ? stdout : stderr,
      "usage: ddl-cuda-bench [options]\n"
      "  -b, --minbytes SIZE   smallest operand (default 64M; K, M, G suffixes)\n"
      "  -e, --maxbytes SIZE   largest operand (default 1G)\n"
      "  -f, --stepfactor N    size multiplier between rows (default 2)\n"
      "  -n, --iters N         timed iterations per figure, median reported (default 20)\n"
      "  -w, --warmup_iters N  untimed iterations first (default 5)\n"
      "  -d, --datatype TYPE   int8 uint8 int32 uint32 int64 uint64 float16 bfloat16 float32 float64\n"
      "                        (default float32)\n"
      "  -o, --op OP           sum prod min max avg, or band bor bxor on integer types (default sum)\n"
      "  -g, --device N        CUDA device (default 0)\n"
      "      --json FILE       also write the results to FILE as JSON ('-': standard output, no table)\n"
      "  -h, --help            this text\n"
      "exit status: 0 ok, 1 wrong result or CUDA error, 2 usage, 77 no CUDA device\n");
  std::exit(status);
}

// A bad flag: says what is wrong (printf-style) and exits with 2; bench_common.h's bench_bad_flag_fn.
[[noreturn]] __attribute__((format(printf, 2, 3))) void badFlag(const char* flag, const char* format, ...) {
  va_list args;
  va_start(args, format);
  bench_report_bad_flag("ddl-cuda-bench", flag, format, args);
  va_end(args);
  std::exit(kExitUsage);
}

// bench_common.h's sizes (8, 64M, 1.5K), above 0: the sweep multiplies them.
size_t parseSize(const char* flag, const char* text) {
  const size_t v = bench_parse_size(flag, text, badFlag);
  if (v == 0) badFlag(flag, "must be above 0");
  return v;
}

int parseCount(const char* flag, const char* text, int lo) {
  return static_cast<int>(bench_parse_integer(flag, text, lo, 1000000, badFlag));
}

Options parseArgs(int argc, char** argv) {
  Options o;
  enum { kJson = 1000 };
  const option longs[] = {{"minbytes", required_argument, nullptr, 'b'},
                          {"maxbytes", required_argument, nullptr, 'e'},
                          {"stepfactor", required_argument, nullptr, 'f'},
                          {"iters", required_argument, nullptr, 'n'},
                          {"warmup_iters", required_argument, nullptr, 'w'},
                          {"datatype", required_argument, nullptr, 'd'},
                          {"op", required_argument, nullptr, 'o'},
                          {"device", required_argument, nullptr, 'g'},
                          {"json", required_argument, nullptr, kJson},
                          {"help", no_argument, nullptr, 'h'},
                          {nullptr, 0, nullptr, 0}};
  for (int c; (c = getopt_long(argc, argv, "b:e:f:n:w:d:o:g:h", longs, nullptr)) != -1;) {
    switch (c) {
      case 'b':
        o.min_bytes = parseSize("--minbytes", optarg);
        break;
      case 'e':
        o.max_bytes = parseSize("--maxbytes", optarg);
        break;
      case 'f':
        o.factor = parseCount("--stepfactor", optarg, 2);
        break;
      case 'n':
        o.iters = parseCount("--iters", optarg, 1);
        break;
      case 'w':
        o.warmup = parseCount("--warmup_iters", optarg, 0);
        break;
      case 'g':
        o.device = parseCount("--device", optarg, 0);
        break;
      case 'd': {
        auto t = ddl::parseType(optarg);
        if (!t) badFlag("--datatype", "is not a type name");
        o.type = *t;
        break;
      }
      case 'o': {
        auto op = ddl::parseOp(optarg);
        if (!op) badFlag("--op", "is not sum, prod, min, max, avg, band, bor or bxor");
        o.op = *op;
        break;
      }
      case kJson:
        if (*optarg == '\0') badFlag("--json", "needs a file name");
        o.json_path = optarg;
        break;
      case 'h':
        usage(kExitOk);
      default:
        usage(kExitUsage);
    }
  }
  if (optind < argc) badFlag(argv[optind], "is not an option");
  if (o.min_bytes > o.max_bytes) badFlag("--minbytes", "is larger than --maxbytes");
  if (o.min_bytes < ddl::typeSize(o.type)) badFlag("--minbytes", "is smaller than one element of --datatype");
  if (!ddl::opTakesType(o.op, o.type)) badFlag("--op", "band, bor and bxor take integer types only");
  return o;
}

struct Row {
  size_t bytes = 0;
  size_t count = 0;
  double reduce_us = 0, inplace_us = 0, copy_us = 0;
  double reduce_gbps = 0, inplace_gbps = 0, copy_gbps = 0;
  size_t wrong = 0;
};

bool cudaOk(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "ddl-cuda-bench: %s failed: %s (%s)\n", what, cudaGetErrorString(e),
               cudaGetErrorName(e));
  return false;
}

#define TRY(call)                             \
  do {                                        \
    if (!cudaOk((call), #call)) return false; \
  } while (0)

// Median GPU time in microseconds of iters runs of launch(), after warmup ones.
template <typename F>
bool timeIt(cudaStream_t stream, int warmup, int iters, double* median_us, F&& launch) {
  cudaEvent_t start, stop;
  TRY(cudaEventCreate(&start));
  TRY(cudaEventCreate(&stop));
  std::vector<float> ms;
  bool ok = true;
  for (int i = 0; i < warmup + iters && ok; ++i) {
    ok = cudaOk(cudaEventRecord(start, stream), "cudaEventRecord") && cudaOk(launch(), "launch") &&
         cudaOk(cudaEventRecord(stop, stream), "cudaEventRecord") &&
         cudaOk(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float t = 0;
    if (ok && i >= warmup) {
      ok = cudaOk(cudaEventElapsedTime(&t, start, stop), "cudaEventElapsedTime");
      ms.push_back(t);
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (!ok) return false;
  std::sort(ms.begin(), ms.end());
  *median_us = 1000.0 * ms[ms.size() / 2];
  return true;
}

// Compares a sample of dst's elements (about 1024, evenly spread, plus the last) with want.
bool countWrong(const void* dst, size_t count, size_t es, const unsigned char* want, size_t* wrong) {
  const size_t samples = std::min<size_t>(count, 1024);
  const size_t step = count / samples;
  std::vector<unsigned char> got(samples * es), last(es);
  TRY(cudaMemcpy2D(got.data(), es, dst, step * es, es, samples, cudaMemcpyDeviceToHost));
  TRY(cudaMemcpy(last.data(), static_cast<const unsigned char*>(dst) + (count - 1) * es, es,
                 cudaMemcpyDeviceToHost));
  *wrong = 0;
  for (size_t i = 0; i < samples; ++i) *wrong += std::memcmp(&got[i * es], want, es) != 0;
  *wrong += std::memcmp(last.data(), want, es) != 0;
  return true;
}

bool measure(const Options& o, size_t bytes, cudaStream_t stream, void* a, void* b, void* d, Row* row) {
  const size_t es = ddl::typeSize(o.type);
  row->count = bytes / es;
  row->bytes = row->count * es;
  const size_t n = row->count;
  // Operands: byte patterns, normal numbers in every float type; the expected element from the CPU.
  const unsigned char pa = 0x3f, pb = 0x40;
  TRY(cudaMemsetAsync(a, pa, row->bytes, stream));
  TRY(cudaMemsetAsync(b, pb, row->bytes, stream));
  std::vector<unsigned char> ea(es, pa), eb(es, pb), want(es);
  ddl::reduce(want.data(), ea.data(), eb.data(), 1, o.type, o.op);

  if (!timeIt(stream, o.warmup, o.iters, &row->reduce_us,
              [&] { return ddl::cuda::reduce(d, a, b, n, o.type, o.op, stream); })) {
    return false;
  }
  if (!countWrong(d, n, es, want.data(), &row->wrong)) return false;
  if (!timeIt(stream, o.warmup, o.iters, &row->copy_us,
              [&] { return cudaMemcpyAsync(d, a, row->bytes, cudaMemcpyDeviceToDevice, stream); })) {
    return false;
  }
  // In place last: it changes a on every run (timing does not care; the values stay finite or saturate).
  if (!timeIt(stream, o.warmup, o.iters, &row->inplace_us,
              [&] { return ddl::cuda::reduce(a, a, b, n, o.type, o.op, stream); })) {
    return false;
  }
  const double s = static_cast<double>(row->bytes);
  row->reduce_gbps = 3 * s / row->reduce_us / 1e3;
  row->inplace_gbps = 3 * s / row->inplace_us / 1e3;
  row->copy_gbps = 2 * s / row->copy_us / 1e3;
  return true;
}

void writeJson(std::FILE* f, const Options& o, const cudaDeviceProp& prop, const std::vector<Row>& rows) {
  std::fprintf(
      f, "{\n  \"tool\": \"ddl-cuda-bench\",\n  \"device\": \"%s\",\n  \"compute_capability\": \"%d.%d\",\n",
      prop.name, prop.major, prop.minor);
  std::fprintf(f, "  \"multiprocessors\": %d,\n  \"type\": \"%s\",\n  \"op\": \"%s\",\n  \"iters\": %d,\n",
               prop.multiProcessorCount, ddl::typeName(o.type), ddl::opName(o.op), o.iters);
  std::fprintf(f, "  \"goal_ratio\": %.2f,\n  \"results\": [\n", kGoal);
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::fprintf(f,
                 "    {\"bytes\": %zu, \"count\": %zu, \"reduce_us\": %.2f, \"reduce_gbps\": %.2f, "
                 "\"inplace_us\": %.2f, \"inplace_gbps\": %.2f, \"copy_us\": %.2f, \"copy_gbps\": %.2f, "
                 "\"ratio\": %.4f, \"wrong\": %zu}%s\n",
                 r.bytes, r.count, r.reduce_us, r.reduce_gbps, r.inplace_us, r.inplace_gbps, r.copy_us,
                 r.copy_gbps, r.reduce_gbps / r.copy_gbps, r.wrong, i + 1 < rows.size() ? "," : "");
  }
  std::fprintf(f, "  ]\n}\n");
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parseArgs(argc, argv);
  int devices = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "ddl-cuda-bench: no CUDA device (%s): nothing to measure\n",
                 e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount found 0");
    return kExitNoDevice;
  }
  if (o.device >= devices) {
    std::fprintf(stderr, "ddl-cuda-bench: --device %d, but there are %d device(s)\n", o.device, devices);
    return kExitUsage;
  }
  cudaDeviceProp prop{};
  if (!cudaOk(cudaSetDevice(o.device), "cudaSetDevice") ||
      !cudaOk(cudaGetDeviceProperties(&prop, o.device), "cudaGetDeviceProperties")) {
    return kExitFailed;
  }
  size_t free_bytes = 0, total_bytes = 0;
  if (!cudaOk(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo")) return kExitFailed;
  size_t max_bytes = o.max_bytes;
  while (max_bytes >= o.min_bytes && 3 * max_bytes + (size_t{256} << 20) > free_bytes) max_bytes /= o.factor;
  if (max_bytes < o.min_bytes) {
    std::fprintf(stderr,
                 "ddl-cuda-bench: three buffers of %zu bytes do not fit in the %zu free bytes of device %d\n",
                 o.min_bytes, free_bytes, o.device);
    return kExitFailed;
  }
  void *a = nullptr, *b = nullptr, *d = nullptr;
  cudaStream_t stream = nullptr;
  if (!cudaOk(cudaMalloc(&a, max_bytes), "cudaMalloc") || !cudaOk(cudaMalloc(&b, max_bytes), "cudaMalloc") ||
      !cudaOk(cudaMalloc(&d, max_bytes), "cudaMalloc") ||
      !cudaOk(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate")) {
    return kExitFailed;
  }

  const bool table = o.json_path != "-";
  if (table) {
    std::printf("# ddl-cuda-bench: %s (sm_%d%d, %d SMs, %.0f GiB), %s %s, median of %d\n", prop.name,
                prop.major, prop.minor, prop.multiProcessorCount, total_bytes / 1073741824.0,
                ddl::typeName(o.type), ddl::opName(o.op), o.iters);
    if (max_bytes < o.max_bytes)
      std::printf("# sizes above %zu bytes skipped: not enough device memory\n", max_bytes);
    std::printf(
        "# reduce and inplace: 3 x bytes moved per run; copy (cudaMemcpy device to device): 2 x bytes\n");
    std::printf("%14s %12s %11s %10s %11s %10s %11s %10s %7s %7s\n", "bytes", "count", "reduce(us)", "GB/s",
                "inplace(us)", "GB/s", "copy(us)", "GB/s", "ratio", "#wrong");
  }
  std::vector<Row> rows;
  bool ok = true;
  for (size_t bytes = o.min_bytes; bytes <= max_bytes && ok; bytes *= o.factor) {
    Row row;
    ok = measure(o, bytes, stream, a, b, d, &row);
    if (!ok) break;
    rows.push_back(row);
    if (table) {
      std::printf("%14zu %12zu %11.1f %10.1f %11.1f %10.1f %11.1f %10.1f %7.3f %7zu\n", row.bytes, row.count,
                  row.reduce_us, row.reduce_gbps, row.inplace_us, row.inplace_gbps, row.copy_us,
                  row.copy_gbps, row.reduce_gbps / row.copy_gbps, row.wrong);
      std::fflush(stdout);
    }
  }
  size_t wrong = 0;
  for (const Row& r : rows) wrong += r.wrong;
  if (table && !rows.empty()) {
    const Row& last = rows.back();
    std::printf("# reduce / copy at %zu bytes: %.3f (goal for float32 sum on large buffers: >= %.2f)\n",
                last.bytes, last.reduce_gbps / last.copy_gbps, kGoal);
  }
  if (!o.json_path.empty()) {
    std::FILE* f = o.json_path == "-" ? stdout : std::fopen(o.json_path.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "ddl-cuda-bench: cannot write %s: %s\n", o.json_path.c_str(),
                   std::strerror(errno));
      ok = false;
    } else {
      writeJson(f, o, prop, rows);
      if (f != stdout) std::fclose(f);
    }
  }
  cudaFree(a);
  cudaFree(b);
  cudaFree(d);
  cudaStreamDestroy(stream);
  if (wrong) std::fprintf(stderr, "ddl-cuda-bench: %zu wrong element(s) in the sampled results\n", wrong);
  return ok && wrong == 0 ? kExitOk : kExitFailed;
}
