// resolveOptions (options.h): ddlConfig_t, then the DDL_* environment, then the defaults, each value checked.
#include "options.h"

#include <cstddef>
#include <string>

#include "algo/tune.h"
#include "device/node_kernel.h"
#include "env.h"
#include "error.h"
#include "rendezvous/store.h"

namespace ddl {

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
  if (nranks > 0) o.topology = parseTopology(topo, nranks);

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
  if (auto v = getEnv("DDL_NODE_BLOCKS"); !v.empty()) {
    o.node_blocks = static_cast<int>(parseInt(v, "DDL_NODE_BLOCKS", node::kMinBlocks, node::kMaxBlocks));
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
