// ddl-bench: libddl's allreduce benchmark, a drop-in for nccl-tests' all_reduce_perf.
//
// Each rank is one process started by ddlrun or ddl-agent; it joins with ddlCommInitFromEnv, sweeps message
// sizes, times out-of-place and in-place ddlAllReduce and checks the results. Rank 0 prints nccl-tests' table
// column for column (same flags, same header, same "# Avg bus bandwidth" footer), so the scripts and plots
// that already read all_reduce_perf output read ours unchanged, and can write the same figures as JSON for a
// side-by-side with bench/mpi_allreduce.c, whose flags, table and JSON writer it shares (bench_common.h). It
// depends on ddl.h alone: no JSON or option library.
//
// Checking: every rank can compute every other rank's input, so every rank knows the exact result of every
// element without any extra communication. The inputs are small integers, exact in every type, chosen per
// (type, op, ranks) so that no partial result leaves the range where the type is exact (see Reference). The
// time reported for a size is the mean over -n iterations of the slowest rank, as the caller sees it.
#include <getopt.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "bench_common.h"  // the flags, table and JSON shared with bench/mpi_allreduce.c
#include "common/version.h"
#include "ddl/ddl.h"
#include "device_buffers.h"  // --device
#include "tune.h"            // --tune

namespace {

constexpr int kExitOk = 0;
constexpr int kExitWrongValues = 1;
constexpr int kExitUsage = 2;
constexpr int kExitDdlError = 3;

// ---- Element types ----

// The result of each reduction is compared as a double: every expected value is a small integer (or, for avg,
// such an integer over nranks), and no wrong value of any type converts to exactly one of those.
struct TypeInfo {
  ddlDataType_t type;
  const char* name;        // as libddl and the JSON spell it
  const char* table_name;  // as nccl-tests spells it, in the table's "type" column
  size_t size;
  // The largest integer all partial results of a sum may reach and stay exact. uint8 stops at 254 so that the
  // 0xff poison written to the receive buffer can never pass for a result.
  double max_exact;
  double avg_tolerance;  // relative error allowed on avg results: they are rounded once (0: integer types)
};

constexpr TypeInfo kTypes[] = {
    {ddlInt8, "int8", "int8", 1, 127, 0},
    {ddlUint8, "uint8", "uint8", 1, 254, 0},
    {ddlInt32, "int32", "int32", 4, 1 << 30, 0},
    {ddlUint32, "uint32", "uint32", 4, 1 << 30, 0},
    {ddlInt64, "int64", "int64", 8, 1 << 30, 0},
    {ddlUint64, "uint64", "uint64", 8, 1 << 30, 0},
    {ddlFloat16, "float16", "half", 2, 2048, 0x1p-10},
    {ddlBfloat16, "bfloat16", "bfloat16", 2, 256, 0x1p-7},
    {ddlFloat32, "float32", "float", 4, 1 << 24, 0x1p-22},
    {ddlFloat64, "float64", "double", 8, 1 << 30, 0x1p-51},
};

struct TypeAlias {
  const char* name;
  ddlDataType_t type;
};
constexpr TypeAlias kTypeAliases[] = {
    {"int8", ddlInt8},       {"uint8", ddlUint8},     {"int32", ddlInt32},       {"int", ddlInt32},
    {"uint32", ddlUint32},   {"int64", ddlInt64},     {"uint64", ddlUint64},     {"half", ddlFloat16},
    {"float16", ddlFloat16}, {"fp16", ddlFloat16},    {"bfloat16", ddlBfloat16}, {"bf16", ddlBfloat16},
    {"float", ddlFloat32},   {"float32", ddlFloat32}, {"fp32", ddlFloat32},      {"double", ddlFloat64},
    {"float64", ddlFloat64}, {"fp64", ddlFloat64},
};

const TypeInfo& typeInfo(ddlDataType_t type) {
  for (const TypeInfo& t : kTypes) {
    if (t.type == type) return t;
  }
  std::abort();  // kTypes covers every ddlDataType_t
}

// Indexed by ddlRedOp_t.
constexpr const char* kOpNames[ddlNumOps] = {"sum", "prod", "min", "max", "avg", "band", "bor", "bxor"};
bool isBitwise(ddlRedOp_t op) { return op == ddlBand || op == ddlBor || op == ddlBxor; }
constexpr const char* kAlgoNames[] = {"auto", "ring", "mdring", "rhd", "shm"};

// IEEE binary16 and bfloat16 bit patterns. Only inputs are encoded, and they are 0, 1, 2 or 3, so the
// encoders need no rounding; the decoders take every pattern, since a wrong result may be anything.
uint16_t halfFromSmallInt(double v) {
  if (v == 0) return 0;
  int exp = 0;
  const double mantissa = std::frexp(v, &exp);  // v = mantissa * 2^exp, mantissa in [0.5, 1)
  const auto fraction = static_cast<uint16_t>((mantissa * 2 - 1) * 1024);
  return static_cast<uint16_t>(((exp - 1 + 15) << 10) | fraction);
}

double halfToDouble(uint16_t h) {
  const int exp = (h >> 10) & 0x1f;
  const int fraction = h & 0x3ff;
  double v;
  if (exp == 0) {
    v = std::ldexp(fraction, -24);
  } else if (exp == 31) {
    v = fraction != 0 ? NAN : INFINITY;
  } else {
    v = std::ldexp(fraction + 1024, exp - 25);
  }
  return (h & 0x8000) != 0 ? -v : v;
}

uint16_t bf16FromSmallInt(double v) {
  const auto f = static_cast<float>(v);
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return static_cast<uint16_t>(bits >> 16);
}

double bf16ToDouble(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// One element of the given type written at dst / read from src.
void encode(ddlDataType_t type, double v, void* dst) {
  switch (type) {
    case ddlInt8:
      *static_cast<int8_t*>(dst) = static_cast<int8_t>(v);
      break;
    case ddlUint8:
      *static_cast<uint8_t*>(dst) = static_cast<uint8_t>(v);
      break;
    case ddlInt32:
      *static_cast<int32_t*>(dst) = static_cast<int32_t>(v);
      break;
    case ddlUint32:
      *static_cast<uint32_t*>(dst) = static_cast<uint32_t>(v);
      break;
    case ddlInt64:
      *static_cast<int64_t*>(dst) = static_cast<int64_t>(v);
      break;
    case ddlUint64:
      *static_cast<uint64_t*>(dst) = static_cast<uint64_t>(v);
      break;
    case ddlFloat16:
      *static_cast<uint16_t*>(dst) = halfFromSmallInt(v);
      break;
    case ddlBfloat16:
      *static_cast<uint16_t*>(dst) = bf16FromSmallInt(v);
      break;
    case ddlFloat32:
      *static_cast<float*>(dst) = static_cast<float>(v);
      break;
    case ddlFloat64:
      *static_cast<double*>(dst) = v;
      break;
    default:
      std::abort();
  }
}

// Counts the elements of buf[0, count) that differ from expected[i % expected.size()] by more than
// tolerance * max(1, |expected|) (tolerance 0: must be equal). Templated on the element so the loop over up
// to -e bytes is a plain loop, not a switch per element.
template <typename Storage, double (*kDecode)(Storage)>
uint64_t countWrongAs(const void* buf, size_t count, const std::vector<double>& expected, double tolerance) {
  const auto* p = static_cast<const Storage*>(buf);
  uint64_t wrong = 0;
  size_t k = 0;
  for (size_t i = 0; i < count; ++i) {
    const double got = kDecode(p[i]);
    const double want = expected[k];
    // Written so that a NaN result counts as wrong.
    const bool ok =
        tolerance == 0 ? got == want : std::fabs(got - want) <= tolerance * std::max(1.0, std::fabs(want));
    wrong += ok ? 0 : 1;
    if (++k == expected.size()) k = 0;
  }
  return wrong;
}

template <typename T>
double toDouble(T v) {
  return static_cast<double>(v);
}

uint64_t countWrong(ddlDataType_t type, const void* buf, size_t count, const std::vector<double>& expected,
                    double tolerance) {
  switch (type) {
    case ddlInt8:
      return countWrongAs<int8_t, toDouble<int8_t>>(buf, count, expected, tolerance);
    case ddlUint8:
      return countWrongAs<uint8_t, toDouble<uint8_t>>(buf, count, expected, tolerance);
    case ddlInt32:
      return countWrongAs<int32_t, toDouble<int32_t>>(buf, count, expected, tolerance);
    case ddlUint32:
      return countWrongAs<uint32_t, toDouble<uint32_t>>(buf, count, expected, tolerance);
    case ddlInt64:
      return countWrongAs<int64_t, toDouble<int64_t>>(buf, count, expected, tolerance);
    case ddlUint64:
      return countWrongAs<uint64_t, toDouble<uint64_t>>(buf, count, expected, tolerance);
    case ddlFloat16:
      return countWrongAs<uint16_t, halfToDouble>(buf, count, expected, tolerance);
    case ddlBfloat16:
      return countWrongAs<uint16_t, bf16ToDouble>(buf, count, expected, tolerance);
    case ddlFloat32:
      return countWrongAs<float, toDouble<float>>(buf, count, expected, tolerance);
    case ddlFloat64:
      return countWrongAs<double, toDouble<double>>(buf, count, expected, tolerance);
    default:
      std::abort();
  }
}

// ---- Inputs and expected results ----

// What this rank sends and what every rank must receive, for one (type, op, nranks). Rank r's element i:
//  - prod: 2 on the one rank with r == i % nranks, 1 elsewhere, so the product is exactly 2 in every type;
//  - sum, avg, min, max, band, bor, bxor: 1 + (r + i) % levels, where levels = min(3, max_exact / nranks) keeps the sum within
//    max_exact (three levels: int8 up to 42 ranks, uint8 and bfloat16 up to 84); when even one level is too
//    many (int8 beyond 127 ranks), 1 on the rank with r == i % nranks and 0 elsewhere.
// avg is the sum divided by nranks: truncated for integer types, as libddl does, and compared with the type's
// avg_tolerance for floating types; everything else is exact. Inputs and results depend on i only through
// i % lcm(nranks, levels), so one period of 6 * nranks elements is computed and repeated.
struct Reference {
  std::vector<unsigned char> input;  // this rank's inputs, one period, encoded
  std::vector<double> expected;      // the results, one period
  double tolerance = 0;
};

Reference makeReference(const TypeInfo& type, ddlRedOp_t op, int nranks, int rank) {
  const int levels = static_cast<int>(std::min<double>(3, std::floor(type.max_exact / nranks)));
  const size_t period = 6 * static_cast<size_t>(nranks);
  auto input = [&](int r, size_t i) -> double {
    const bool marked = static_cast<int>(i % nranks) == r;
    if (op == ddlProd) return marked ? 2 : 1;
    if (levels == 0) return marked ? 1 : 0;
    return 1 + static_cast<double>((r + i) % levels);
  };

  Reference ref;
  ref.input.resize(period * type.size);
  ref.expected.resize(period);
  ref.tolerance = (op == ddlAvg) ? type.avg_tolerance : 0;
  for (size_t i = 0; i < period; ++i) {
    encode(type.type, input(rank, i), &ref.input[i * type.size]);
    double acc = input(0, i);
    for (int r = 1; r < nranks; ++r) {
      const double v = input(r, i);
      switch (op) {
        case ddlProd:
          acc *= v;
          break;
        case ddlMin:
          acc = std::min(acc, v);
          break;
        case ddlMax:
          acc = std::max(acc, v);
          break;
        case ddlBand:
          acc = static_cast<double>(static_cast<long long>(acc) & static_cast<long long>(v));
          break;
        case ddlBor:
          acc = static_cast<double>(static_cast<long long>(acc) | static_cast<long long>(v));
          break;
        case ddlBxor:
          acc = static_cast<double>(static_cast<long long>(acc) ^ static_cast<long long>(v));
          break;
        default:  // sum, avg
          acc += v;
          break;
      }
    }
    if (op == ddlAvg) acc = type.avg_tolerance == 0 ? std::floor(acc / nranks) : acc / nranks;
    ref.expected[i] = acc;
  }
  return ref;
}

// Writes this rank's inputs for elements [0, count) to buf: one period, then doubling copies of it.
void fillInputs(const Reference& ref, void* buf, size_t count, size_t elem_size) {
  auto* out = static_cast<unsigned char*>(buf);
  const size_t total = count * elem_size;
  size_t filled = std::min(total, ref.input.size());
  std::memcpy(out, ref.input.data(), filled);
  while (filled < total) {
    const size_t n = std::min(filled, total - filled);
    std::memcpy(out + filled, out, n);
    filled += n;
  }
}

// ---- Command line ----

struct Options {
  bench_sweep sweep = bench_sweep_defaults();
  ddlDataType_t type = ddlFloat32;
  ddlRedOp_t op = ddlSum;
  std::string algo;  // empty: not given (libddl then reads DDL_ALGO)
  std::string json_path;
  std::string tune_path;  // --tune: explore and write a tuning table instead of the table
  bool device = false;    // --device: the buffers are CUDA device memory
  // With --device, how the collective is called: enqueued on a stream (ddlAllReduceOnStream), host-blocking
  // (--blocking: ddlAllReduce), or one stream-ordered call captured in a CUDA graph and replayed (--graph).
  enum class Mode { kStream, kBlocking, kGraph } mode = Mode::kStream;
  bool registered = false;  // --registered: the device buffers registered with ddlCommRegister (zero-copy)
};

constexpr const char* kUsage =
    "usage: ddlrun -np N [ddlrun options] -- ddl-bench [options]\n"
    "Times ddlAllReduce over a range of sizes and prints nccl-tests' all_reduce_perf table (rank 0).\n"  //
    BENCH_USAGE_SWEEP_FLAGS
    "  -d, --datatype TYPE      int8 uint8 int32 uint32 int64 uint64 half/float16 bfloat16 float/float32\n"
    "                           double/float64 (default float)\n"
    "  -o, --op OP              sum prod min max avg, or band bor bxor on integer types (default sum)\n"
    "  -a, --algo ALGO          auto ring mdring rhd shm (default: DDL_ALGO, else auto)\n"
    "      --json FILE          rank 0 also writes the results to FILE as JSON\n"
    "      --tune FILE          time every algorithm and segment size per size and write the fastest as a\n"
    "                           tuning table for DDL_TUNE_FILE (rules for other rank counts in FILE are "
    "kept)\n"
    "      --device             CUDA device buffers (device DDL_LOCAL_RANK mod the GPUs; builds with CUDA),\n"
    "                           stream-ordered: ddlAllReduceOnStream, N calls on a stream, then one sync\n"
    "      --blocking           with --device: the host-blocking ddlAllReduce instead\n"
    "      --graph              with --device: one ddlAllReduceOnStream captured in a CUDA graph, replayed\n"
    "      --registered         with --device: the buffers registered (ddlCommRegister): the node kernel "
    "reads\n"
    "                           and writes them in place\n"
    "  -h, --help               this text\n"
    "      --version            print ddl-bench's version\n"
    "Exit status: 0 all results right, 1 wrong values, 2 bad flags, 3 a libddl error.\n";

// A bad flag: says what is wrong (printf-style) and exits with 2; bench_common.h's bench_bad_flag_fn.
[[noreturn]] __attribute__((format(printf, 2, 3))) void badFlag(const char* flag, const char* format, ...) {
  va_list args;
  va_start(args, format);
  bench_report_bad_flag("ddl-bench", flag, format, args);
  va_end(args);
  std::exit(kExitUsage);
}

Options parseOptions(int argc, char** argv) {
  enum {
    kJsonOption = 256,
    kTuneOption,
    kVersionOption,
    kDeviceOption,
    kBlockingOption,
    kGraphOption,
    kRegisteredOption
  };
  static const option kLongOptions[] = {
      BENCH_SWEEP_LONG_OPTIONS,
      {"datatype", required_argument, nullptr, 'd'},
      {"op", required_argument, nullptr, 'o'},
      {"algo", required_argument, nullptr, 'a'},
      {"json", required_argument, nullptr, kJsonOption},
      {"tune", required_argument, nullptr, kTuneOption},
      {"device", no_argument, nullptr, kDeviceOption},
      {"blocking", no_argument, nullptr, kBlockingOption},
      {"graph", no_argument, nullptr, kGraphOption},
      {"registered", no_argument, nullptr, kRegisteredOption},
      {"help", no_argument, nullptr, 'h'},
      {"version", no_argument, nullptr, kVersionOption},
      {nullptr, 0, nullptr, 0},
  };
  Options o;
  int factor_given = 0;
  int step_given = 0;
  int c;
  opterr = 0;  // ddl-bench words its own messages; the leading ':' makes a missing value ':', not '?'
  constexpr const char* kShortOptions = ":" BENCH_SWEEP_SHORT_OPTIONS "d:o:a:h";
  while ((c = getopt_long(argc, argv, kShortOptions, kLongOptions, nullptr)) != -1) {
    if (bench_parse_sweep_flag(c, optarg, &o.sweep, &factor_given, &step_given, badFlag)) continue;
    switch (c) {
      case 'd': {
        const TypeAlias* found = nullptr;
        for (const TypeAlias& a : kTypeAliases) {
          if (std::string_view(optarg) == a.name) found = &a;
        }
        if (found == nullptr) {
          badFlag(
              "-d",
              "unknown datatype '%s' (use int8 uint8 int32 uint32 int64 uint64 half bfloat16 float double, "
              "or float16 float32 float64)",
              optarg);
        }
        o.type = found->type;
        break;
      }
      case 'o': {
        int found = -1;
        for (int i = 0; i < ddlNumOps; ++i) {
          if (std::string_view(optarg) == kOpNames[i]) found = i;
        }
        if (found < 0) badFlag("-o", "unknown op '%s' (use sum prod min max avg band bor bxor)", optarg);
        o.op = static_cast<ddlRedOp_t>(found);
        break;
      }
      case 'a':
        if (std::none_of(std::begin(kAlgoNames), std::end(kAlgoNames),
                         [](const char* name) { return std::string_view(optarg) == name; })) {
          badFlag("-a", "unknown algorithm '%s' (use auto ring mdring rhd shm)", optarg);
        }
        o.algo = optarg;
        break;
      case kJsonOption:
        if (*optarg == '\0') badFlag("--json", "needs a file name");
        o.json_path = optarg;
        break;
      case kTuneOption:
        if (*optarg == '\0') badFlag("--tune", "needs a file name");
        o.tune_path = optarg;
        break;
      case kDeviceOption:
#ifndef DDL_BENCH_CUDA
        badFlag("--device", "this ddl-bench was built without the CUDA Toolkit");
#endif
        o.device = true;
        break;
      case kBlockingOption:
        o.mode = Options::Mode::kBlocking;
        break;
      case kGraphOption:
        o.mode = Options::Mode::kGraph;
        break;
      case kRegisteredOption:
        o.registered = true;
        break;
      case 'h':
        std::fputs(kUsage, stdout);
        std::exit(kExitOk);
      case kVersionOption:
        std::printf("ddl-bench %s\n", ddl::kVersion);
        std::exit(kExitOk);
      case ':':  // the flag is the last argument, just consumed
        badFlag(argv[optind - 1], "needs a value");
      default: {  // '?': optopt names an unknown short flag, 0 for an unknown long one
        const std::string flag =
            optopt != 0 ? std::string("-") + static_cast<char>(optopt) : argv[optind - 1];
        badFlag(flag.c_str(), "unknown flag");
      }
    }
  }
  if (optind < argc) badFlag(argv[optind], "unexpected argument (ddl-bench takes flags only)");
  if (isBitwise(o.op) && o.type != ddlInt8 && o.type != ddlUint8 && o.type != ddlInt32 && o.type != ddlUint32 &&
      o.type != ddlInt64 && o.type != ddlUint64) {
    badFlag("-o", "op '%s' takes integer types only (-d int8 uint8 int32 uint32 int64 uint64)", kOpNames[o.op]);
  }
  bench_finish_sweep(&o.sweep, factor_given, step_given, badFlag);
  if (!o.tune_path.empty() && !o.algo.empty()) badFlag("-a", "cannot be combined with --tune, which tries them all");
  if (!o.tune_path.empty() && o.device)
    badFlag("--device", "cannot be combined with --tune (host buffers only)");
  if (o.mode != Options::Mode::kStream && !o.device)
    badFlag(o.mode == Options::Mode::kGraph ? "--graph" : "--blocking", "needs --device");
  if (o.registered && (!o.device || o.mode == Options::Mode::kBlocking))
    badFlag("--registered", "needs --device, and the stream-ordered calls (not --blocking)");
  return o;
}

// ---- Results ----

// bench_common.h's: wrong is -1 when -c 0.
using Variant = bench_variant;
using Row = bench_row;

// ---- The benchmark ----

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<unsigned char, FreeDeleter>;

// One rank's run of the sweep. Single-threaded: everything runs on the main thread.
class Bench {
 public:
  Bench(ddlComm_t comm, Options options)
      : comm_(comm), opt_(std::move(options)), type_(typeInfo(opt_.type)) {}

  // The whole run; returns the exit status. A libddl error exits from inside (see ok()).
  int run() {
    ok(ddlCommUserRank(comm_, &rank_));
    ok(ddlCommCount(comm_, &nranks_));
    char topology[256] = {};
    ok(ddlCommGetTopology(comm_, topology, sizeof topology));
    topology_ = topology;
    char path[64] = {};
    ok(ddlCommGetIntraNodePath(comm_, path, sizeof path));
    path_ = path;
    // What libddl uses: the flag, else DDL_ALGO (read by libddl when config.algorithm is NULL), else auto.
    const char* env_algo = std::getenv("DDL_ALGO");
    algo_ = !opt_.algo.empty() ? opt_.algo : (env_algo != nullptr && *env_algo != '\0') ? env_algo : "auto";

    std::FILE* json = nullptr;
    if (rank_ == 0 && !opt_.json_path.empty()) {
      json = std::fopen(opt_.json_path.c_str(), "w");
      if (json == nullptr) {
        bench_json_cannot_write("ddl-bench", opt_.json_path.c_str());
        ddlCommAbort(comm_);  // the other ranks' next call fails instead of waiting for rank 0
        std::exit(kExitUsage);
      }
    }

    const bench_sweep& sweep = opt_.sweep;
    const size_t max_count = sweep.max_bytes / type_.size;
    const size_t buffer_bytes = std::max<size_t>(max_count, 1) * type_.size;
    send_ = allocate(buffer_bytes);
    recv_ = allocate(buffer_bytes);
    if (opt_.device) {
      const std::string why = device_.open(buffer_bytes);
      if (!why.empty()) {
        std::fprintf(stderr, "ddl-bench: rank %d: --device: %s\n", rank_, why.c_str());
        ddlCommAbort(comm_);
        std::exit(kExitDdlError);
      }
      if (opt_.registered) {
        ok(ddlCommRegister(comm_, device_.send, buffer_bytes, &reg_send_));
        ok(ddlCommRegister(comm_, device_.recv, buffer_bytes, &reg_recv_));
      }
    }
    const Reference ref = makeReference(type_, opt_.op, nranks_, rank_);

    printHeader();
    std::vector<Row> rows;
    for (size_t size = sweep.min_bytes; size <= sweep.max_bytes;) {
      const size_t count = size / type_.size;
      if (count > 0 && (rows.empty() || rows.back().count != count)) {
        Row row{};
        row.count = count;
        row.bytes = count * type_.size;
        row.out_of_place = measure(false, count, ref);
        row.in_place = measure(true, count, ref);
        if (rank_ == 0) bench_print_row(&row, type_.table_name, kOpNames[opt_.op]);
        rows.push_back(row);
      }
      if (!bench_next_size(&sweep, &size)) break;
    }

    const bench_summary summary = bench_summarize(rows.data(), rows.size());
    if (rank_ == 0) bench_print_summary(&summary);
    // Writes and closes json (mpi-allreduce-bench's schema too); false, after saying so, if that failed.
    const bool json_ok =
        json == nullptr ||
        bench_write_json(json, "ddl-bench", opt_.json_path.c_str(), nranks_, topology_.c_str(), algo_.c_str(),
                         type_.name, kOpNames[opt_.op], rows.data(), rows.size());
    if (reg_recv_) ok(ddlCommDeregister(comm_, reg_recv_));
    if (reg_send_) ok(ddlCommDeregister(comm_, reg_send_));
    ok(ddlCommDestroy(comm_));
    if (summary.total_wrong > 0) return kExitWrongValues;
    return json_ok ? kExitOk : kExitUsage;
  }

 private:
  // On any libddl error: report it, tell the peers (so they fail now rather than at their timeout) and exit.
  void ok(ddlResult_t result) {
    if (result == ddlSuccess) return;
    std::fprintf(stderr, "ddl-bench: rank %d: %s\n", rank_, ddlGetLastError(comm_));
    ddlCommAbort(comm_);
    std::exit(kExitDdlError);
  }

  Buffer allocate(size_t bytes) {
    const size_t rounded = (bytes + 4095) / 4096 * 4096;
    Buffer buf(static_cast<unsigned char*>(std::aligned_alloc(4096, rounded)));
    if (!buf) {
      std::fprintf(stderr, "ddl-bench: rank %d: cannot allocate %zu bytes (lower -e)\n", rank_, bytes);
      ddlCommAbort(comm_);
      std::exit(kExitDdlError);
    }
    std::memset(buf.get(), 0, rounded);  // fault the pages in now, not inside the timed loop
    return buf;
  }

  // The buffers the collective gets: the host ones, or with --device their device twins.
  void* recvBuf() { return opt_.device ? device_.recv : recv_.get(); }
  void* sendBuf() { return opt_.device ? device_.send : send_.get(); }
  // With --device: the host buffer's first bytes to its device twin, or back.
  void upload(const unsigned char* host, size_t bytes) {
    if (opt_.device) deviceOk(device_.copy(host == recv_.get() ? device_.recv : device_.send, host, bytes));
  }
  void deviceOk(const std::string& why) {
    if (why.empty()) return;
    std::fprintf(stderr, "ddl-bench: rank %d: --device: %s\n", rank_, why.c_str());
    ddlCommAbort(comm_);
    std::exit(kExitDdlError);
  }

  Variant measure(bool in_place, size_t count, const Reference& ref) {
    void* recv = recvBuf();
    const void* send = in_place ? recv : sendBuf();
    // Timing runs do not check. In place, each iteration reduces the previous result again (the values grow,
    // wrap or saturate to inf, which costs nothing extra), so the buffer is filled afresh for the check.
    unsigned char* input = in_place ? recv_.get() : send_.get();
    fillInputs(ref, input, count, type_.size);
    upload(input, count * type_.size);
    Variant v;
    v.time_us = timeAllReduce(send, recv, count);
    bench_set_bandwidth(&v, static_cast<double>(count * type_.size), nranks_);
    v.wrong = opt_.sweep.check > 0 ? static_cast<long long>(checkAllReduce(in_place, count, ref)) : -1;
    return v;
  }

  bool streamOrdered() const { return opt_.device && opt_.mode != Options::Mode::kBlocking; }

  // One collective as the mode calls it: stream-ordered ones are enqueued only (deviceOk(device_.sync())
  // waits).
  void allReduceOnce(const void* send, void* recv, size_t count) {
    if (streamOrdered()) {
      ok(ddlAllReduceOnStream(send, recv, count, opt_.type, opt_.op, comm_, device_.stream));
    } else {
      ok(ddlAllReduce(send, recv, count, opt_.type, opt_.op, comm_));
    }
  }

  // Barrier, warmup, barrier, then the mean time of -n iterations, the slowest rank's.
  double timeAllReduce(const void* send, void* recv, size_t count) {
    if (streamOrdered()) return timeOnStream(send, recv, count);
    const double us = ddlbench::timeAllReduce(comm_, "rank " + std::to_string(rank_), send, recv, count, opt_.type,
                                              opt_.op, opt_.sweep.warmup_iters, opt_.sweep.iters);
    if (us < 0) {  // already reported
      ddlCommAbort(comm_);
      std::exit(kExitDdlError);
    }
    return us;
  }

  // The stream-ordered forms: -n calls (or graph replays) enqueued, then one synchronisation, as nccl-tests
  // time NCCL. The first warmup call sets the communicator's GPU memory up.
  double timeOnStream(const void* send, void* recv, size_t count) {
    ok(ddlBarrier(comm_));
    for (int i = 0; i < std::max(1, opt_.sweep.warmup_iters); ++i) allReduceOnce(send, recv, count);
    deviceOk(device_.sync());
    const bool graph = opt_.mode == Options::Mode::kGraph;
    if (graph) {
      deviceOk(device_.capture([&](std::string* why) {
        if (ddlAllReduceOnStream(send, recv, count, opt_.type, opt_.op, comm_, device_.stream) == ddlSuccess)
          return true;
        *why = ddlGetLastError(comm_);
        return false;
      }));
      ok(ddlCommGetAsyncError(comm_, &async_));
      ok(async_);
      deviceOk(device_.replay());  // the graph's first launch uploads it: not timed
      deviceOk(device_.sync());
    }
    ok(ddlBarrier(comm_));
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < opt_.sweep.iters; ++i) {
      if (graph) {
        deviceOk(device_.replay());
      } else {
        allReduceOnce(send, recv, count);
      }
    }
    deviceOk(device_.sync());
    const auto end = std::chrono::steady_clock::now();
    ok(ddlCommGetAsyncError(comm_, &async_));
    ok(async_);
    double us = std::chrono::duration<double, std::micro>(end - start).count() / opt_.sweep.iters;
    ok(ddlAllReduce(&us, &us, 1, ddlFloat64, ddlMax, comm_));
    return us;
  }

  // The wrong elements over all ranks, from the first of -c checks that finds any (as nccl-tests).
  uint64_t checkAllReduce(bool in_place, size_t count, const Reference& ref) {
    uint64_t wrong = 0;
    for (int c = 0; c < opt_.sweep.check; ++c) {
      unsigned char* recv = recv_.get();
      const size_t bytes = count * type_.size;
      if (in_place) {
        fillInputs(ref, recv, count, type_.size);
      } else {
        fillInputs(ref, send_.get(), count, type_.size);
        upload(send_.get(), bytes);
        // Poison: NaN for floats, -1 or the maximum for integers; no expected value is any of them.
        std::memset(recv, 0xff, bytes);
      }
      upload(recv, bytes);
      const void* send = in_place ? recvBuf() : sendBuf();
      allReduceOnce(send, recvBuf(), count);
      if (streamOrdered()) deviceOk(device_.sync());
      if (opt_.device) deviceOk(device_.copy(recv, device_.recv, bytes));
      wrong = countWrong(opt_.type, recv, count, ref.expected, ref.tolerance);
      ok(ddlAllReduce(&wrong, &wrong, 1, ddlUint64, ddlSum, comm_));
      if (wrong > 0) break;
    }
    return wrong;
  }

  void printHeader() {
    // Every rank says where it runs, like nccl-tests' "Using devices"; rank 0 prints the lines in rank order.
    char line[BENCH_RANK_LINE];
    bench_rank_line(line, sizeof line, rank_);
    std::vector<char> lines(static_cast<size_t>(BENCH_RANK_LINE) * nranks_);
    ok(ddlAllGather(line, lines.data(), BENCH_RANK_LINE, ddlUint8, comm_));
    if (rank_ != 0) return;

    int version = 0;
    ddlGetVersion(&version);
    std::printf("# ddl-bench  ranks %d  topology %s  algo %s  intra-node %s  libddl %d.%d.%d\n", nranks_,
                topology_.c_str(), algo_.c_str(), path_.c_str(), version / 10000, version / 100 % 100, version % 100);
    bench_print_sweep(&opt_.sweep);
    std::printf("# algo: %s%s\n", algo_.c_str(),
                algo_ == "auto" ? " (libddl picks one per message size)" : "");
    if (opt_.device) {
      const char* how = opt_.mode == Options::Mode::kBlocking ? "host-blocking ddlAllReduce"
                        : opt_.mode == Options::Mode::kGraph
                            ? "ddlAllReduceOnStream in a CUDA graph, replayed"
                            : "ddlAllReduceOnStream, enqueued then synchronised";
      std::printf("# buffers: CUDA device memory (%s)%s; %s\n", device_.where.c_str(),
                  opt_.registered ? ", registered (ddlCommRegister)" : "", how);
    }
    bench_print_table_head(lines.data(), nranks_);
  }

  ddlComm_t comm_;
  Options opt_;
  const TypeInfo& type_;
  int rank_ = 0;
  int nranks_ = 1;
  std::string topology_;
  std::string path_;  // ddlCommGetIntraNodePath
  std::string algo_;
  Buffer send_;
  Buffer recv_;
  ddlbench::DeviceBuffers device_;  // --device only
  void* reg_send_ = nullptr;        // --registered: the registrations
  void* reg_recv_ = nullptr;
  ddlResult_t async_ = ddlSuccess;
};

}  // namespace

int main(int argc, char** argv) {
  setlinebuf(stdout);
  Options options = parseOptions(argc, argv);
  if (!options.tune_path.empty()) {
    return ddlbench::runTune({options.sweep, options.type, typeInfo(options.type).size, options.op, options.tune_path});
  }

  ddlConfig_t config = DDL_CONFIG_INITIALIZER;
  if (!options.algo.empty()) config.algorithm = options.algo.c_str();
  ddlComm_t comm = nullptr;
  if (ddlCommInitFromEnv(&comm, &config) != ddlSuccess) {
    const char* rank = std::getenv("DDL_RANK");
    std::fprintf(stderr, "ddl-bench: rank %s: %s\n", rank != nullptr ? rank : "?", ddlGetLastError(nullptr));
    return kExitDdlError;
  }
  return Bench(comm, std::move(options)).run();
}
