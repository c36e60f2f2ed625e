// Tuning tables (tune.h): the file format's parser and writer, the built-in table, and rule lookup.
#include "algo/tune.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "common/topology_dims.h"
#include "env.h"
#include "error.h"

namespace ddl {
namespace {

// The built-in table, from ddl-bench --tune sweeps over shared memory at 2, 3 and 4 ranks and the 2x2 network
// namespace hierarchy (docs/benchmarks.md), kept coarse because it must suit links it was not measured on:
// recursive halving-doubling while latency dominates (up to 4 KiB; at 3 ranks, where no grid exists, up to
// 128 KiB, with the ring at 64 KiB segments above); then the multi-dimensional ring on a grid (mdring falls
// back to the flat ring where the rank count is prime): with 256 KiB segments on a flat topology (one host, or
// no hierarchy given; shared memory at 4 ranks, 5 runs in shuffled order: 4-20% faster than 64 KiB from 64 KiB
// to 64 MiB), and with 64 KiB segments on a configured hierarchy, where short segments keep the slow link's
// pipeline short (2x2 at 1 Gbit/s: mdring/ring 1.23-1.32x at 4 MiB against 0.93-0.95x with 256 KiB).
// At 2 ranks rhd is one exchange of halves, the ring's data in one message each way instead of segments; over
// shared memory it was level or a little faster up to 4 MiB (6 shuffled runs: 2-6%; the comparison harness:
// 4.50-7.67 against 4.33-6.09 GB/s busbw) and slower above, where the pipelined ring keeps the reduction in
// cache.
constexpr const char* kBuiltin = R"(ddl-tune 1
allreduce 2 * 4M rhd 0
allreduce 3 * 128K rhd 0
allreduce 3 * 8M ring 64K
allreduce * * 4K rhd 0
allreduce * flat inf mdring 0
allreduce * * inf mdring 64K
)";

bool parseBytes(const std::string& text, size_t* out) {
  if (text == "inf") {
    *out = SIZE_MAX;
    return true;
  }
  if (text.empty() || text[0] < '0' || text[0] > '9') return false;
  size_t pos = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(text, &pos);
  } catch (...) {
    return false;
  }
  std::string suffix = text.substr(pos);
  int shift = suffix.empty() ? 0 : suffix == "K" ? 10 : suffix == "M" ? 20 : suffix == "G" ? 30 : -1;
  if (shift < 0 || v > (SIZE_MAX >> shift)) return false;
  *out = static_cast<size_t>(v) << shift;
  return true;
}

// TOPOLOGY as ddlCommGetTopology prints it: ddl's topology grammar (common/topology_dims.h), written as
// Topology::str() writes it ("2x2", not "2X2" or "02x2": find() compares the text); with a rank count, the dims'
// product must be it (a rule that can never match is a mistake in the file).
void checkTopology(const std::string& text, int nranks, const std::string& where) {
  auto bad = [&](const std::string& why) {
    fail(ddlInvalidArgument, where + "topology '" + text + "' " + why + " (expected dims like 2x2 or 4, flat, or *)");
  };
  std::vector<int> dims;
  if (std::string why = parseTopologyDims(text, &dims); !why.empty()) bad("is not a topology: " + why);
  if (formatTopologyDims(dims) != text) {
    bad("is not written as ddlCommGetTopology prints it; write it " + formatTopologyDims(dims));
  }
  if (const long long product = topologyRanks(dims); nranks > 0 && product != nranks) {
    bad("has " + std::to_string(product) + " ranks but the rule is for " + std::to_string(nranks));
  }
}

std::string formatBytes(size_t n) {
  if (n == SIZE_MAX) return "inf";
  for (auto [suffix, shift] : {std::pair{"G", 30}, {"M", 20}, {"K", 10}}) {
    if (n >= (size_t{1} << shift) && n % (size_t{1} << shift) == 0) return std::to_string(n >> shift) + suffix;
  }
  return std::to_string(n);
}

}  // namespace

std::string TuneTable::formatRule(const TuneRule& r) {
  return "allreduce " + (r.nranks > 0 ? std::to_string(r.nranks) : std::string("*")) + " " +
         (r.topology.empty() ? std::string("*") : r.topology) + " " + formatBytes(r.max_bytes) + " " +
         algoName(r.algo) + " " + (r.segment_bytes ? formatBytes(r.segment_bytes) : std::string("0"));
}

std::shared_ptr<const TuneTable> TuneTable::parse(const std::string& text, const std::string& origin) {
  auto table = std::make_shared<TuneTable>();
  std::istringstream in(text);
  std::string line;
  bool versioned = false;
  for (int lineno = 1; std::getline(in, line); ++lineno) {
    if (line.size() > kMaxTuneLineBytes) {
      fail(ddlInvalidArgument, origin + ":" + std::to_string(lineno) + ": the line is " +
                                   std::to_string(line.size()) + " bytes long; a rule takes at most " +
                                   std::to_string(kMaxTuneLineBytes));
    }
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    std::vector<std::string> w;
    for (std::string s; words >> s;) w.push_back(s);
    if (w.empty()) continue;
    const std::string where = origin + ":" + std::to_string(lineno) + ": ";
    if (!versioned) {
      if (w.size() != 2 || w[0] != "ddl-tune") fail(ddlInvalidArgument, where + "expected 'ddl-tune 1' first");
      if (w[1] != "1") fail(ddlInvalidArgument, where + "format version " + w[1] + " is not supported (1 is)");
      versioned = true;
      continue;
    }
    if (w[0] != "allreduce") {
      fail(ddlInvalidArgument, where + "unknown collective '" + w[0] + "' (only allreduce rules exist)");
    }
    if (w.size() != 6) {
      fail(ddlInvalidArgument, where + "expected 'allreduce RANKS TOPOLOGY MAX_BYTES ALGO SEGMENT', got " +
                                   std::to_string(w.size()) + " fields");
    }
    TuneRule r;
    if (w[1] != "*") {
      r.nranks = static_cast<int>(parseInt(w[1], (where + "RANKS").c_str(), 1, 1 << 15));
    }
    if (w[2] != "*") {
      if (w[2] != "flat") checkTopology(w[2], r.nranks, where);
      r.topology = w[2];
    }
    if (!parseBytes(w[3], &r.max_bytes) || r.max_bytes == 0) {
      fail(ddlInvalidArgument, where + "MAX_BYTES '" + w[3] + "' is not a byte count above 0 (e.g. 65536, 64K, inf)");
    }
    if (w[4] != "ring" && w[4] != "mdring" && w[4] != "rhd") {
      fail(ddlInvalidArgument, where + "ALGO '" + w[4] + "' is not ring, mdring or rhd");
    }
    r.algo = parseAlgo(w[4]);
    if (!parseBytes(w[5], &r.segment_bytes) || r.segment_bytes > kMaxTuneSegmentBytes ||
        (r.segment_bytes != 0 && r.segment_bytes < kMinTuneSegmentBytes)) {
      fail(ddlInvalidArgument, where + "SEGMENT '" + w[5] + "' is not a byte count from 1K to 1G (or 0: default)");
    }
    if (table->rules_.size() >= kMaxTuneRules) {
      fail(ddlInvalidArgument, where + "more than " + std::to_string(kMaxTuneRules) + " rules");
    }
    table->rules_.push_back(r);
  }
  if (!versioned) fail(ddlInvalidArgument, origin + ": empty (expected 'ddl-tune 1' and rules)");
  // FNV-1a over the rules as they would be written: comments and spacing do not change the digest.
  uint64_t h = 1469598103934665603ULL;
  for (const auto& r : table->rules_) {
    for (char c : formatRule(r) + "\n") {
      h ^= static_cast<unsigned char>(c);
      h *= 1099511628211ULL;
    }
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  table->digest_ = hex;
  return table;
}

std::shared_ptr<const TuneTable> TuneTable::load(const std::string& path) {
  const std::string what = "DDL_TUNE_FILE " + path + ": ";
  // O_NONBLOCK: opening a FIFO does not wait for a writer (it is refused below as not a regular file).
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail(ddlInvalidArgument, what + "cannot be read: " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st{};
  if (::fstat(fd, &st) != 0) fail(ddlInvalidArgument, what + "cannot be read: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) {
    fail(ddlInvalidArgument, what + "is not a regular file (a tuning table from ddl-bench --tune is expected)");
  }
  // Read at most one byte past the limit, whatever st_size says (the file may grow while we read).
  std::string text;
  for (;;) {
    char buf[16384];
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(ddlInvalidArgument, what + "cannot be read: " + std::strerror(errno));
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > kMaxTuneFileBytes) {
      fail(ddlInvalidArgument, what + "is larger than " + std::to_string(kMaxTuneFileBytes >> 10) +
                                   " KiB; a tuning table is a few lines (is it the right file?)");
    }
  }
  return parse(text, path);
}

const TuneTable& TuneTable::builtin() {
  static const std::shared_ptr<const TuneTable> table = parse(kBuiltin, "built-in tuning table");
  return *table;
}

namespace {
// "flat": at most one dim of the topology is larger than 1 ("4", "4x1", "1x8"), i.e. no hierarchy is known.
bool isFlat(const std::string& topology) {
  // Runs per allreduce when a 'flat' rule is reached: a scan, no allocation.
  int big = 0;
  size_t start = 0;
  for (size_t i = 0; i <= topology.size(); ++i) {
    if (i < topology.size() && topology[i] != 'x') continue;
    const size_t len = i - start;
    if (len > 0 && !(len == 1 && topology[start] == '1')) ++big;
    start = i + 1;
  }
  return big <= 1;
}
}  // namespace

const TuneRule* TuneTable::find(int nranks, const std::string& topology, size_t bytes) const {
  for (const auto& r : rules_) {
    if ((r.nranks == 0 || r.nranks == nranks) && bytes <= r.max_bytes &&
        (r.topology.empty() || r.topology == topology || (r.topology == "flat" && isFlat(topology)))) {
      return &r;
    }
  }
  return nullptr;
}

}  // namespace ddl
