// ddl-bench: libddl's allreduce benchmark, a drop-in for nccl-tests' all_reduce_perf.
//
// Each rank is one process started by ddlrun or ddl-agent; it joins with ddlCommInitFromEnv, sweeps message
// sizes, times out-of-place and in-place ddlAllReduce and checks the results. Rank 0 prints nccl-tests' table
// column for column (same flags, same header, same "# Avg bus bandwidth" footer), so the scripts and plots
// that already read all_reduce_perf output read ours unchanged, and can write the same figures as JSON for a
// side-by-side with bench/mpi_allreduce.c. It depends on ddl.h alone: no JSON or option library.
//
// Checking: every rank can compute every other rank's input, so every rank knows the exact result of every
// element without any extra communication. The inputs are small integers, exact in every type, chosen per
// (type, op, ranks) so that no partial result leaves the range where the type is exact (see Reference). The
// time reported for a size is the mean over -n iterations of the slowest rank, as the caller sees it.
#include <getopt.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ddl/ddl.h"

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
constexpr const char* kOpNames[ddlNumOps] = {"sum", "prod", "min", "max", "avg"};
constexpr const char* kAlgoNames[] = {"auto", "ring", "mdring", "rhd"};

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
//  - sum, avg, min, max: 1 + (r + i) % levels, where levels = min(3, max_exact / nranks) keeps the sum within
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
  size_t min_bytes = 8;
  size_t max_bytes = 64 << 20;
  size_t step_factor = 2;
  size_t step_bytes = 1 << 20;
  int iters = 20;
  int warmup_iters = 5;
  int check = 1;  // check iterations per size and variant; 0: no check ("N/A")
  ddlDataType_t type = ddlFloat32;
  ddlRedOp_t op = ddlSum;
  std::string algo;  // empty: not given (libddl then reads DDL_ALGO)
  std::string json_path;
};

constexpr const char* kUsage =
    "usage: ddlrun -np N [ddlrun options] -- ddl-bench [options]\n"
    "Times ddlAllReduce over a range of sizes and prints nccl-tests' all_reduce_perf table (rank 0).\n"
    "  -b, --minbytes SIZE      smallest message, bytes; suffix K, M or G (default 8)\n"
    "  -e, --maxbytes SIZE      largest message (default 64M)\n"
    "  -f, --stepfactor N       multiply the size by N each step (default 2)\n"
    "  -i, --stepbytes SIZE     add SIZE each step instead; used when -f is not given or is 1 (default 1M)\n"
    "  -n, --iters N            timed iterations per size (default 20)\n"
    "  -w, --warmup_iters N     untimed iterations before them (default 5)\n"
    "  -c, --check N            check the result N times per size, 0 to skip (default 1)\n"
    "  -d, --datatype TYPE      int8 uint8 int32 uint32 int64 uint64 half/float16 bfloat16 float/float32\n"
    "                           double/float64 (default float)\n"
    "  -o, --op OP              sum prod min max avg (default sum)\n"
    "  -a, --algo ALGO          auto ring mdring rhd (default: DDL_ALGO, else auto)\n"
    "      --json FILE          rank 0 also writes the results to FILE as JSON\n"
    "  -h, --help               this text\n"
    "Exit status: 0 all results right, 1 wrong values, 2 bad flags, 3 a libddl error.\n";

[[noreturn]] void badFlag(const char* flag, const std::string& what) {
  std::fprintf(stderr, "ddl-bench: %s: %s\n(ddl-bench --help lists the flags)\n", flag, what.c_str());
  std::exit(kExitUsage);
}

// "8", "64M", "1.5K", "1G": a byte count as nccl-tests reads it (binary K/M/G; fractions rounded down).
size_t parseSize(const char* flag, const char* text) {
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(text, &end);
  bool ok = end != text && errno == 0 && std::isfinite(v) && v >= 0 &&
            std::isdigit(static_cast<unsigned char>(text[0]));
  if (ok && *end != '\0') {
    switch (*end) {
      case 'k':
      case 'K':
        v *= 1 << 10;
        break;
      case 'm':
      case 'M':
        v *= 1 << 20;
        break;
      case 'g':
      case 'G':
        v *= 1 << 30;
        break;
      default:
        ok = false;
    }
    ok = ok && end[1] == '\0';
  }
  if (!ok || v >= 0x1p62) {
    badFlag(flag, std::string("invalid size '") + text + "' (use bytes, optionally with K, M or G: 8, 64M)");
  }
  return static_cast<size_t>(v);
}

long long parseInteger(const char* flag, const char* text, long long min, long long max) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || errno != 0 || v < min || v > max) {
    badFlag(flag, std::string("invalid value '") + text + "' (use an integer from " + std::to_string(min) +
                      " to " + std::to_string(max) + ")");
  }
  return v;
}

Options parseOptions(int argc, char** argv) {
  enum { kJsonOption = 256 };
  static const option kLongOptions[] = {
      {"minbytes", required_argument, nullptr, 'b'},
      {"maxbytes", required_argument, nullptr, 'e'},
      {"stepfactor", required_argument, nullptr, 'f'},
      {"stepbytes", required_argument, nullptr, 'i'},
      {"iters", required_argument, nullptr, 'n'},
      {"warmup_iters", required_argument, nullptr, 'w'},
      {"check", required_argument, nullptr, 'c'},
      {"datatype", required_argument, nullptr, 'd'},
      {"op", required_argument, nullptr, 'o'},
      {"algo", required_argument, nullptr, 'a'},
      {"json", required_argument, nullptr, kJsonOption},
      {"help", no_argument, nullptr, 'h'},
      {nullptr, 0, nullptr, 0},
  };
  Options o;
  bool factor_given = false;
  bool step_given = false;
  int c;
  opterr = 0;  // ddl-bench words its own messages; the leading ':' makes a missing value ':', not '?'
  while ((c = getopt_long(argc, argv, ":b:e:f:i:n:w:c:d:o:a:h", kLongOptions, nullptr)) != -1) {
    switch (c) {
      case 'b':
        o.min_bytes = parseSize("-b", optarg);
        break;
      case 'e':
        o.max_bytes = parseSize("-e", optarg);
        break;
      case 'f':
        o.step_factor = static_cast<size_t>(parseInteger("-f", optarg, 1, 1 << 20));
        factor_given = true;
        break;
      case 'i':
        o.step_bytes = parseSize("-i", optarg);
        step_given = true;
        break;
      case 'n':
        o.iters = static_cast<int>(parseInteger("-n", optarg, 1, 1 << 30));
        break;
      case 'w':
        o.warmup_iters = static_cast<int>(parseInteger("-w", optarg, 0, 1 << 30));
        break;
      case 'c':
        o.check = static_cast<int>(parseInteger("-c", optarg, 0, 1 << 20));
        break;
      case 'd': {
        const TypeAlias* found = nullptr;
        for (const TypeAlias& a : kTypeAliases) {
          if (std::string_view(optarg) == a.name) found = &a;
        }
        if (found == nullptr) {
          badFlag("-d", std::string("unknown datatype '") + optarg +
                            "' (use int8 uint8 int32 uint32 int64 uint64 half bfloat16 float double, or "
                            "float16 float32 float64)");
        }
        o.type = found->type;
        break;
      }
      case 'o': {
        int found = -1;
        for (int i = 0; i < ddlNumOps; ++i) {
          if (std::string_view(optarg) == kOpNames[i]) found = i;
        }
        if (found < 0) badFlag("-o", std::string("unknown op '") + optarg + "' (use sum prod min max avg)");
        o.op = static_cast<ddlRedOp_t>(found);
        break;
      }
      case 'a':
        if (std::none_of(std::begin(kAlgoNames), std::end(kAlgoNames),
                         [](const char* name) { return std::string_view(optarg) == name; })) {
          badFlag("-a", std::string("unknown algorithm '") + optarg + "' (use auto ring mdring rhd)");
        }
        o.algo = optarg;
        break;
      case kJsonOption:
        if (*optarg == '\0') badFlag("--json", "needs a file name");
        o.json_path = optarg;
        break;
      case 'h':
        std::fputs(kUsage, stdout);
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
  // As nccl-tests: the sizes grow by the factor when it is above 1, else by the step. -i alone means steps.
  if (step_given && !factor_given) o.step_factor = 1;
  if (o.step_factor == 1 && o.step_bytes == 0) badFlag("-i", "must be above 0 when sizes grow linearly");
  if (o.step_factor > 1 && o.min_bytes == 0) badFlag("-b", "must be above 0 when sizes grow by a factor");
  if (o.min_bytes > o.max_bytes) {
    badFlag("-b",
            "minbytes " + std::to_string(o.min_bytes) + " is above maxbytes " + std::to_string(o.max_bytes));
  }
  return o;
}

// ---- Results ----

struct Variant {
  double time_us = 0;
  double algbw = 0;  // GB/s, GB = 1e9 bytes
  double busbw = 0;
  std::optional<uint64_t> wrong;  // empty when -c 0
};

struct Row {
  size_t bytes = 0;
  size_t count = 0;
  Variant out_of_place;
  Variant in_place;
};

// nccl-tests' time column: two decimals below 100 us, one below 10 ms, none above.
std::string formatTime(double us) {
  char buf[32];
  const char* format = us >= 10000.0 ? "%7.0f" : us >= 100.0 ? "%7.1f" : "%7.2f";
  std::snprintf(buf, sizeof buf, format, us);
  return buf;
}

std::string jsonString(std::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto u = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (u < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", u);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string jsonNumber(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string jsonWrong(const std::optional<uint64_t>& wrong) {
  return wrong ? std::to_string(*wrong) : "null";
}

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
    // What libddl uses: the flag, else DDL_ALGO (read by libddl when config.algorithm is NULL), else auto.
    const char* env_algo = std::getenv("DDL_ALGO");
    algo_ = !opt_.algo.empty() ? opt_.algo : (env_algo != nullptr && *env_algo != '\0') ? env_algo : "auto";

    std::FILE* json = nullptr;
    if (rank_ == 0 && !opt_.json_path.empty()) {
      json = std::fopen(opt_.json_path.c_str(), "w");
      if (json == nullptr) {
        std::fprintf(stderr, "ddl-bench: --json: cannot write '%s': %s\n", opt_.json_path.c_str(),
                     std::strerror(errno));
        ddlCommAbort(comm_);  // the other ranks' next call fails instead of waiting for rank 0
        std::exit(kExitUsage);
      }
    }

    const size_t max_count = opt_.max_bytes / type_.size;
    const size_t buffer_bytes = std::max<size_t>(max_count, 1) * type_.size;
    send_ = allocate(buffer_bytes);
    recv_ = allocate(buffer_bytes);
    const Reference ref = makeReference(type_, opt_.op, nranks_, rank_);

    printHeader();
    std::vector<Row> rows;
    for (size_t size = opt_.min_bytes; size <= opt_.max_bytes;) {
      const size_t count = size / type_.size;
      if (count > 0 && (rows.empty() || rows.back().count != count)) {
        Row row;
        row.count = count;
        row.bytes = count * type_.size;
        row.out_of_place = measure(false, count, ref);
        row.in_place = measure(true, count, ref);
        if (rank_ == 0) printRow(row);
        rows.push_back(row);
      }
      if (opt_.step_factor > 1) {
        if (size > opt_.max_bytes / opt_.step_factor) break;
        size *= opt_.step_factor;
      } else {
        if (size > opt_.max_bytes - opt_.step_bytes) break;
        size += opt_.step_bytes;
      }
    }

    uint64_t total_wrong = 0;
    int failed_checks = 0;  // nccl-tests' "Out of bounds values": checks that found any wrong value
    double busbw_sum = 0;
    for (const Row& row : rows) {
      for (const Variant* v : {&row.out_of_place, &row.in_place}) {
        total_wrong += v->wrong.value_or(0);
        failed_checks += v->wrong.value_or(0) > 0 ? 1 : 0;
        busbw_sum += v->busbw;
      }
    }
    if (rank_ == 0) {
      const double avg_busbw = rows.empty() ? 0 : busbw_sum / (2 * rows.size());
      std::printf("# Out of bounds values : %d %s\n", failed_checks, failed_checks ? "FAILED" : "OK");
      std::printf("# Avg bus bandwidth    : %g \n", avg_busbw);
      std::printf("#\n");
      if (total_wrong > 0)
        std::printf("# FAILED: %llu wrong values\n", static_cast<unsigned long long>(total_wrong));
      std::fflush(stdout);
    }
    const bool json_ok = json == nullptr || writeJson(json, rows);
    ok(ddlCommDestroy(comm_));
    if (total_wrong > 0) return kExitWrongValues;
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

  Variant measure(bool in_place, size_t count, const Reference& ref) {
    void* recv = recv_.get();
    const void* send = in_place ? recv : send_.get();
    // Timing runs do not check. In place, each iteration reduces the previous result again (the values grow,
    // wrap or saturate to inf, which costs nothing extra), so the buffer is filled afresh for the check.
    fillInputs(ref, in_place ? recv : send_.get(), count, type_.size);
    Variant v;
    v.time_us = timeAllReduce(send, recv, count);
    const double bytes = static_cast<double>(count * type_.size);
    v.algbw = bytes / (v.time_us * 1e3);
    v.busbw = v.algbw * 2.0 * (nranks_ - 1) / nranks_;
    if (opt_.check > 0) v.wrong = checkAllReduce(in_place, count, ref);
    return v;
  }

  // Barrier, warmup, barrier, then the mean time of -n iterations, the slowest rank's.
  double timeAllReduce(const void* send, void* recv, size_t count) {
    ok(ddlBarrier(comm_));
    for (int i = 0; i < opt_.warmup_iters; ++i)
      ok(ddlAllReduce(send, recv, count, opt_.type, opt_.op, comm_));
    ok(ddlBarrier(comm_));
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < opt_.iters; ++i) ok(ddlAllReduce(send, recv, count, opt_.type, opt_.op, comm_));
    const auto end = std::chrono::steady_clock::now();
    double us = std::chrono::duration<double, std::micro>(end - start).count() / opt_.iters;
    ok(ddlAllReduce(&us, &us, 1, ddlFloat64, ddlMax, comm_));
    return us;
  }

  // The wrong elements over all ranks, from the first of -c checks that finds any (as nccl-tests).
  uint64_t checkAllReduce(bool in_place, size_t count, const Reference& ref) {
    uint64_t wrong = 0;
    for (int c = 0; c < opt_.check; ++c) {
      unsigned char* recv = recv_.get();
      if (in_place) {
        fillInputs(ref, recv, count, type_.size);
      } else {
        fillInputs(ref, send_.get(), count, type_.size);
        // Poison: NaN for floats, -1 or the maximum for integers; no expected value is any of them.
        std::memset(recv, 0xff, count * type_.size);
      }
      const void* send = in_place ? recv : send_.get();
      ok(ddlAllReduce(send, recv, count, opt_.type, opt_.op, comm_));
      wrong = countWrong(opt_.type, recv, count, ref.expected, ref.tolerance);
      ok(ddlAllReduce(&wrong, &wrong, 1, ddlUint64, ddlSum, comm_));
      if (wrong > 0) break;
    }
    return wrong;
  }

  void printHeader() {
    // Every rank says where it runs, like nccl-tests' "Using devices"; rank 0 prints the lines in rank order.
    constexpr size_t kLine = 160;
    char line[kLine] = {};
    char host[64] = {};
    gethostname(host, sizeof host - 1);
    std::snprintf(line, kLine, "#  Rank %2d Pid %6d on %10s", rank_, static_cast<int>(getpid()), host);
    std::vector<char> lines(kLine * nranks_);
    ok(ddlAllGather(line, lines.data(), kLine, ddlUint8, comm_));
    if (rank_ != 0) return;

    int version = 0;
    ddlGetVersion(&version);
    std::printf("# ddl-bench  ranks %d  topology %s  algo %s  libddl %d.%d.%d\n", nranks_, topology_.c_str(),
                algo_.c_str(), version / 10000, version / 100 % 100, version % 100);
    std::printf("# minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d iters: %d validation: %d\n",
                opt_.min_bytes, opt_.max_bytes, opt_.step_factor > 1 ? opt_.step_factor : opt_.step_bytes,
                opt_.step_factor > 1 ? "factor" : "bytes", opt_.warmup_iters, opt_.iters, opt_.check);
    std::printf("# algo: %s%s\n", algo_.c_str(),
                algo_ == "auto" ? " (libddl picks one per message size)" : "");
    std::printf("#\n# Using ranks\n");
    for (int r = 0; r < nranks_; ++r) std::printf("%.*s\n", static_cast<int>(kLine - 1), &lines[r * kLine]);
    std::printf("#\n");
    std::printf(
        "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n", "",
        "", "", "", "");
    std::printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\n", "size", "count",
                "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw",
                "#wrong");
    std::printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s\n", "(B)", "(elements)",
                "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
    std::fflush(stdout);
  }

  void printRow(const Row& row) {
    std::printf("%12zu  %12zu  %8s  %6s  %6d", row.bytes, row.count, type_.table_name, kOpNames[opt_.op], -1);
    for (const Variant* v : {&row.out_of_place, &row.in_place}) {
      char wrong[32];
      if (v->wrong) {
        std::snprintf(wrong, sizeof wrong, "%5g", static_cast<double>(*v->wrong));
      } else {
        std::snprintf(wrong, sizeof wrong, "%5s", "N/A");
      }
      std::printf("  %7s  %6.2f  %6.2f  %5s", formatTime(v->time_us).c_str(), v->algbw, v->busbw, wrong);
    }
    std::printf("\n");
    std::fflush(stdout);
  }

  // Writes and closes f; false (after saying so) if that failed.
  bool writeJson(std::FILE* f, const std::vector<Row>& rows) {
    std::string out = "{\"ranks\": " + std::to_string(nranks_) + ", \"topology\": " + jsonString(topology_) +
                      ", \"algo\": " + jsonString(algo_) + ", \"results\": [";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      out += i == 0 ? "\n  " : ",\n  ";
      out += "{\"bytes\": " + std::to_string(r.bytes) + ", \"count\": " + std::to_string(r.count) +
             ", \"type\": " + jsonString(type_.name) + ", \"redop\": " + jsonString(kOpNames[opt_.op]) +
             ", \"algo\": " + jsonString(algo_) + ", \"time_us\": " + jsonNumber(r.out_of_place.time_us) +
             ", \"algbw_GBs\": " + jsonNumber(r.out_of_place.algbw) +
             ", \"busbw_GBs\": " + jsonNumber(r.out_of_place.busbw) +
             ", \"wrong\": " + jsonWrong(r.out_of_place.wrong) +
             ", \"inplace_time_us\": " + jsonNumber(r.in_place.time_us) +
             ", \"inplace_algbw_GBs\": " + jsonNumber(r.in_place.algbw) +
             ", \"inplace_busbw_GBs\": " + jsonNumber(r.in_place.busbw) +
             ", \"inplace_wrong\": " + jsonWrong(r.in_place.wrong) + "}";
    }
    out += rows.empty() ? "]}\n" : "\n]}\n";
    const bool written = std::fputs(out.c_str(), f) >= 0;
    if (std::fclose(f) != 0 || !written) {
      std::fprintf(stderr, "ddl-bench: --json: cannot write '%s': %s\n", opt_.json_path.c_str(),
                   std::strerror(errno));
      return false;
    }
    return true;
  }

  ddlComm_t comm_;
  Options opt_;
  const TypeInfo& type_;
  int rank_ = 0;
  int nranks_ = 1;
  std::string topology_;
  std::string algo_;
  Buffer send_;
  Buffer recv_;
};

}  // namespace

int main(int argc, char** argv) {
  setlinebuf(stdout);
  Options options = parseOptions(argc, argv);

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
