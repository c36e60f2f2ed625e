#include "tools/ddl-sim/hierarchy.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace ddl::sim {

namespace fs = std::filesystem;

StatusOr<std::string> readTextFile(const std::string& path) {
  constexpr std::uintmax_t kMaxBytes = 64u << 20;
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) return Status::notFound(path + ": " + ec.message());
  if (size > kMaxBytes) return Status::invalidArgument(path + ": larger than 64 MiB, not a ddl-sim input");
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::notFound(path + ": " + std::strerror(errno));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

StatusOr<HierarchyRun> loadHierarchy(const std::string& out_dir) {
  HierarchyRun h;
  h.dir = out_dir;
  const fs::path raw = fs::path(out_dir) / "raw";
  std::error_code ec;
  if (!fs::is_directory(raw, ec)) {
    return Status::notFound(out_dir + ": no raw/ directory (is this bench/hierarchy.sh's --out directory?)");
  }
  std::vector<fs::path> reps;
  for (const auto& e : fs::directory_iterator(raw, ec))
    if (e.is_directory() && e.path().filename().string().rfind("rep", 0) == 0) reps.push_back(e.path());
  std::sort(reps.begin(), reps.end());
  if (reps.empty()) return Status::notFound(raw.string() + ": no rep*/ directories");
  h.reps = static_cast<int>(reps.size());
  for (const fs::path& rep : reps) {
    std::map<std::string, Perftest> best;  // per test name in this rep
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(rep, ec))
      if (e.is_regular_file()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) {
      const std::string name = f.filename().string();
      if (name.rfind("perftest-", 0) == 0 && f.extension() == ".txt") {
        // perftest-NAME.txt or perftest-NAME-K.txt (several runs: the best bandwidth).
        std::string test = name.substr(9, name.size() - 9 - 4);
        const size_t dash = test.find_last_of('-');
        if (dash != std::string::npos && std::all_of(test.begin() + dash + 1, test.end(), ::isdigit) &&
            dash + 1 < test.size()) {
          test = test.substr(0, dash);
        }
        StatusOr<std::string> text = readTextFile(f.string());
        if (!text.isOk()) {
          h.warnings.push_back(text.status().message());
          continue;
        }
        StatusOr<Perftest> p = parsePerftest(*text, f.string());
        if (!p.isOk()) {
          h.warnings.push_back(p.status().message());
          continue;
        }
        auto it = best.find(test);
        if (it == best.end() || p->bw_Bps > it->second.bw_Bps) best[test] = *p;
      } else if (f.extension() == ".telemetry" && name.rfind("mdring.", 0) == 0) {
        StatusOr<std::string> text = readTextFile(f.string());
        if (!text.isOk()) {
          h.warnings.push_back(text.status().message());
          continue;
        }
        std::istringstream lines(*text);
        std::string line;
        while (std::getline(lines, line)) {
          double bytes = 0;
          std::vector<double> dims;
          if (parseMdringTelemetry(line, &bytes, &dims)) h.mdring_dims_us[bytes].push_back(dims);
        }
      } else if (f.extension() == ".json") {
        const std::string algo = name.substr(0, name.find('.'));
        StatusOr<std::string> text = readTextFile(f.string());
        if (!text.isOk()) {
          h.warnings.push_back(text.status().message());
          continue;
        }
        StatusOr<BenchRun> run = parseBenchJson(*text, f.string());
        if (!run.isOk()) {
          h.warnings.push_back(run.status().message());
          continue;
        }
        h.bench[algo].push_back(std::move(*run));
      }
    }
    for (auto& [test, p] : best) h.perftest[test].push_back(p);
  }
  return h;
}

bool parseMdringTelemetry(const std::string& line, double* bytes, std::vector<double>* dims_us) {
  std::istringstream in(line);
  std::string word;
  if (!(in >> word) || word != "ddl1") return false;
  std::map<std::string, std::string> kv;
  while (in >> word) {
    const size_t eq = word.find('=');
    if (eq != std::string::npos) kv[word.substr(0, eq)] = word.substr(eq + 1);
  }
  if (kv["last_algo"] != "mdring" || kv["dims_us"].empty() || kv["count"] == "1") return false;
  try {
    size_t used = 0;
    *bytes = std::stod(kv["last_bytes"], &used);
    if (used != kv["last_bytes"].size() || *bytes <= 0) return false;
    dims_us->clear();
    std::istringstream d(kv["dims_us"]);
    std::string item;
    while (std::getline(d, item, ',')) {
      const double v = std::stod(item, &used);
      if (used != item.size() || v < 0) return false;
      dims_us->push_back(v);
    }
  } catch (const std::exception&) {
    return false;
  }
  return !dims_us->empty();
}

std::map<double, double> medianTimes(const std::vector<BenchRun>& runs) {
  std::map<double, std::vector<double>> by_size;
  for (const BenchRun& r : runs)
    for (const BenchPoint& p : r.points) by_size[p.bytes].push_back(p.seconds);
  std::map<double, double> out;
  for (auto& [bytes, v] : by_size) out[bytes] = median(v);
  return out;
}

}  // namespace ddl::sim
