#include "env.h"

#include <cerrno>
#include <cstddef>
#include <cstdlib>

#include "algo/tune.h"
#include "error.h"
#include "rendezvous/store.h"

namespace ddl {

const char* algoName(Algo a) {
  switch (a) {
    case Algo::kAuto: return "auto";
    case Algo::kRing: return "ring";
    case Algo::kMdRing: return "mdring";
    case Algo::kRhd: return "rhd";
    case Algo::kShm: return "shm";
  }
  return "invalid";
}

const char* deviceSchemeName(DeviceScheme s) {
  switch (s) {
    case DeviceScheme::kAuto:
      return "auto";
    case DeviceScheme::kKernel:
      return "kernel";
    case DeviceScheme::kHost:
      return "host";
  }
  return "invalid";
}

Algo parseAlgo(const std::string& name) {
  for (Algo a : {Algo::kAuto, Algo::kRing, Algo::kMdRing, Algo::kRhd, Algo::kShm}) {
    if (name == algoName(a)) return a;
  }
  fail(ddlInvalidArgument, "unknown algorithm '" + name + "': use auto, ring, mdring, rhd or shm");
}

std::string getEnv(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

long long parseInt(const std::string& text, const char* what, long long lo, long long hi) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || errno || *end != '\0' || v < lo || v > hi) {
    fail(ddlInvalidArgument, std::string(what) + " must be an integer in [" + std::to_string(lo) + ", " +
                                 std::to_string(hi) + "], got '" + text + "'");
  }
  return v;
}

long long parseByteCount(const std::string& text, const char* what, long long lo, long long hi) {
  std::string digits = text;
  int shift = 0;
  if (!digits.empty()) {
    const char last = digits.back();
    shift = last == 'K' || last == 'k'   ? 10
            : last == 'M' || last == 'm' ? 20
            : last == 'G' || last == 'g' ? 30
                                         : 0;
    if (shift) digits.pop_back();
  }
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(digits.c_str(), &end, 10);
  if (digits.empty() || errno || *end != '\0' || v < 0 || v > (hi >> shift) || (v << shift) < lo) {
    fail(ddlInvalidArgument, std::string(what) + " must be a byte count from " + std::to_string(lo) + " to " +
                                 std::to_string(hi) +
                                 " (a K, M or G suffix multiplies by 1024, 1024^2, 1024^3), got '" + text +
                                 "'");
  }
  return v << shift;
}

Options resolveOptions(const ddlConfig_t* config, int nranks) {
  if (config && (config->size < sizeof(size_t) + sizeof(unsigned) || config->version == 0 ||
                 config->version > DDL_CONFIG_VERSION)) {
    fail(ddlInvalidArgument, "ddlConfig_t was not initialised with DDL_CONFIG_INITIALIZER (size " +
                                 std::to_string(config->size) + ", version " + std::to_string(config->version) + ")");
  }
  Options o;
  if (config && config->timeoutMs > 0) {
    o.timeout_ms = config->timeoutMs;
    o.timeout_from_config = true;
  } else if (auto v = getEnv("DDL_TIMEOUT_MS"); !v.empty()) {
    o.timeout_ms = static_cast<int>(parseInt(v, "DDL_TIMEOUT_MS", 1, 24LL * 3600 * 1000));
  } else {
    o.timeout_ms = kDefaultTimeoutMs;
  }

  std::string topo = (config && config->topology) ? config->topology : getEnv("DDL_TOPOLOGY");
  o.topology = parseTopology(topo, nranks);

  const bool algo_from_config = config && config->algorithm;
  const char* algo_source = algo_from_config ? "ddlConfig_t.algorithm" : "DDL_ALGO";
  std::string algo = algo_from_config ? config->algorithm : getEnv("DDL_ALGO");
  try {
    o.algo = algo.empty() ? Algo::kAuto : parseAlgo(algo);
  } catch (const Error& e) {
    fail(e.code(), std::string(algo_source) + ": " + e.what());
  }

  if (config && config->segmentBytes > 0) {
    o.segment_bytes = config->segmentBytes;
  } else if (auto v = getEnv("DDL_SEGMENT_BYTES"); !v.empty()) {
    o.segment_bytes = static_cast<size_t>(parseByteCount(v, "DDL_SEGMENT_BYTES", 1, 1LL << 30));
  }
  if (auto v = getEnv("DDL_TUNE_FILE"); !v.empty()) o.tune = TuneTable::load(v);
  if (auto v = getEnv("DDL_SHM"); !v.empty()) {
    if (v == "1" || v == "on" || v == "auto") {
      o.shm = true;
    } else if (v == "0" || v == "off") {
      o.shm = false;
    } else {
      fail(ddlInvalidArgument, "DDL_SHM must be on (or auto, 1) or off (or 0), got '" + v + "'");
    }
  }
  if (auto v = getEnv("DDL_SHM_ROUND_BYTES"); !v.empty()) {
    o.shm_round_bytes = static_cast<size_t>(parseByteCount(v, "DDL_SHM_ROUND_BYTES", 4096, 64LL << 20));
  }
  if (auto v = getEnv("DDL_DEVICE_SCHEME"); !v.empty()) {
    if (v == "auto") {
      o.device_scheme = DeviceScheme::kAuto;
    } else if (v == "kernel") {
      o.device_scheme = DeviceScheme::kKernel;
    } else if (v == "host") {
      o.device_scheme = DeviceScheme::kHost;
    } else {
      fail(ddlInvalidArgument, "DDL_DEVICE_SCHEME must be auto, kernel or host, got '" + v + "'");
    }
  }
  if (auto v = getEnv("DDL_NODE_SLOT_BYTES"); !v.empty()) {
    o.node_slot_bytes =
        static_cast<size_t>(parseByteCount(v, "DDL_NODE_SLOT_BYTES", 64 << 10, 1LL << 30)) / 16 * 16;
  }
  if (o.algo == Algo::kShm && !o.shm) {
    fail(ddlInvalidArgument, std::string(algo_source) + "=shm needs shared memory, but DDL_SHM is off");
  }

  // Version 2 added waitMode; a version-1 struct ends before it.
  const bool has_wait = config && config->version >= 2 && config->size >= offsetof(ddlConfig_t, waitMode) + sizeof(int);
  if (has_wait && config->waitMode != ddlWaitAuto) {
    if (config->waitMode < 0 || config->waitMode >= ddlNumWaitModes) {
      fail(ddlInvalidArgument, "ddlConfig_t.waitMode " + std::to_string(config->waitMode) +
                                   " is not a ddlWaitMode_t (ddlWaitAuto, ddlWaitSpin, ddlWaitShare)");
    }
    o.wait = static_cast<ddlWaitMode_t>(config->waitMode);
  } else if (auto v = getEnv("DDL_WAIT"); !v.empty()) {
    if (v == "auto") {
      o.wait = ddlWaitAuto;
    } else if (v == "spin") {
      o.wait = ddlWaitSpin;
    } else if (v == "share") {
      o.wait = ddlWaitShare;
    } else {
      fail(ddlInvalidArgument, "DDL_WAIT must be auto, spin or share, got '" + v + "'");
    }
  }

  // Version 3 added secret. The secret is never quoted in a message.
  const bool has_secret = config && config->version >= 3 &&
                          config->size >= offsetof(ddlConfig_t, secret) + sizeof(const char*);
  const bool secret_from_config = has_secret && config->secret && config->secret[0] != '\0';
  const char* secret_name = secret_from_config ? "ddlConfig_t.secret" : "DDL_JOB_SECRET";
  o.secret = secret_from_config ? config->secret : getEnv("DDL_JOB_SECRET");
  if (o.secret.size() > kMaxJobSecretBytes) {
    fail(ddlInvalidArgument, std::string(secret_name) + " is " + std::to_string(o.secret.size()) +
                                 " bytes long; at most " + std::to_string(kMaxJobSecretBytes) +
                                 " are allowed");
  }
  return o;
}

}  // namespace ddl
