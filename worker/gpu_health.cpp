// GPU faults from NVML and the site's health check program (gpu_health.h).
#include "worker/gpu_health.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

namespace ddl::worker {

namespace {

// NVML's C ABI (nvml.h), declared here as inventory.cpp does: opaque handles, 0 = success.
using NvmlDevice = void*;
using NvmlEventSet = void*;
struct NvmlEventData {  // nvmlEventData_t
  NvmlDevice device;
  unsigned long long eventType, eventData;
  unsigned int gpuInstanceId, computeInstanceId;
};
struct NvmlMemory {
  unsigned long long total, free, used;
};
constexpr unsigned long long kXidEvent = 0x8;   // nvmlEventTypeXidCriticalError
constexpr int kGpuLost = 15;                    // NVML_ERROR_GPU_IS_LOST
constexpr int kUncorrected = 1, kVolatile = 0;  // nvmlMemoryErrorType_t, nvmlEccCounterType_t

}  // namespace

struct GpuHealth::Nvml {
  void* lib = nullptr;
  int (*init)() = nullptr;
  int (*shutdown)() = nullptr;
  int (*count)(unsigned int*) = nullptr;
  int (*handle)(unsigned int, NvmlDevice*) = nullptr;
  int (*eventSetCreate)(NvmlEventSet*) = nullptr;
  int (*eventSetFree)(NvmlEventSet) = nullptr;
  int (*registerEvents)(NvmlDevice, unsigned long long, NvmlEventSet) = nullptr;
  int (*eventWait)(NvmlEventSet, NvmlEventData*, unsigned int) = nullptr;
  int (*ecc)(NvmlDevice, int, int, unsigned long long*) = nullptr;
  int (*remapped)(NvmlDevice, unsigned int*, unsigned int*, unsigned int*, unsigned int*) = nullptr;
  int (*retiredPending)(NvmlDevice, int*) = nullptr;
  int (*clockReasons)(NvmlDevice, unsigned long long*) = nullptr;
  int (*memory)(NvmlDevice, NvmlMemory*) = nullptr;
  std::vector<NvmlDevice> devices;
  NvmlEventSet events = nullptr;

  ~Nvml() {
    if (events && eventSetFree) eventSetFree(events);
    if (shutdown) shutdown();
    if (lib) dlclose(lib);
  }
  template <class F>
  void find(F& f, const char* name) {
    f = reinterpret_cast<F>(dlsym(lib, name));
  }
  int indexOf(NvmlDevice d) const {
    for (size_t i = 0; i < devices.size(); ++i)
      if (devices[i] == d) return static_cast<int>(i);
    return -1;
  }
};

std::string fatalXid(int xid) {
  switch (xid) {
    case 48:
      return "double-bit ECC error";
    case 61:
    case 62:
      return "internal micro-controller error";
    case 63:
      return "ECC page retirement or row remap recorded";
    case 64:
      return "ECC page retirement or row remap failed";
    case 74:
      return "NVLink error";
    case 79:
      return "fallen off the bus";
    case 92:
      return "high single-bit ECC error rate";
    case 94:
      return "contained ECC error";
    case 95:
      return "uncontained ECC error";
    case 119:
    case 120:
      return "GSP error";
    case 140:
      return "unrecovered ECC error";
    default:
      return "";
  }
}

std::unique_ptr<GpuHealth> GpuHealth::open(int gpus) {
  if (gpus <= 0) return nullptr;
  auto nvml = std::make_unique<Nvml>();
  nvml->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!nvml->lib) return nullptr;
  nvml->find(nvml->init, "nvmlInit_v2");
  nvml->find(nvml->count, "nvmlDeviceGetCount_v2");
  nvml->find(nvml->handle, "nvmlDeviceGetHandleByIndex_v2");
  if (!nvml->init || !nvml->count || !nvml->handle || nvml->init() != 0) return nullptr;
  nvml->find(nvml->shutdown, "nvmlShutdown");  // only once init succeeded
  unsigned int n = 0;
  if (nvml->count(&n) != 0 || static_cast<int>(n) < gpus) return nullptr;
  for (int i = 0; i < gpus; ++i) {
    NvmlDevice d = nullptr;
    if (nvml->handle(static_cast<unsigned int>(i), &d) != 0) return nullptr;
    nvml->devices.push_back(d);
  }
  nvml->find(nvml->eventSetCreate, "nvmlEventSetCreate");
  nvml->find(nvml->eventSetFree, "nvmlEventSetFree");
  nvml->find(nvml->registerEvents, "nvmlDeviceRegisterEvents");
  nvml->find(nvml->eventWait, "nvmlEventSetWait_v2");
  nvml->find(nvml->ecc, "nvmlDeviceGetTotalEccErrors");
  nvml->find(nvml->remapped, "nvmlDeviceGetRemappedRows");
  nvml->find(nvml->retiredPending, "nvmlDeviceGetRetiredPagesPendingStatus");
  nvml->find(nvml->clockReasons, "nvmlDeviceGetCurrentClocksEventReasons");  // the newer name first
  if (!nvml->clockReasons) nvml->find(nvml->clockReasons, "nvmlDeviceGetCurrentClocksThrottleReasons");
  nvml->find(nvml->memory, "nvmlDeviceGetMemoryInfo");
  if (nvml->eventSetCreate && nvml->registerEvents && nvml->eventWait &&
      nvml->eventSetCreate(&nvml->events) == 0) {
    for (NvmlDevice d : nvml->devices) {
      // A GPU that cannot report Xids (some do not) is still polled for the rest.
      if (nvml->registerEvents(d, kXidEvent, nvml->events) != 0)
        spdlog::warn("GPU {}: NVML gives no Xid events for it; its ECC and remap counters are still watched",
                     nvml->indexOf(d));
    }
  } else {
    nvml->events = nullptr;
  }
  return std::unique_ptr<GpuHealth>(new GpuHealth(std::move(nvml)));
}

GpuHealth::GpuHealth(std::unique_ptr<Nvml> nvml)
    : nvml_(std::move(nvml)),
      ecc_seen_(nvml_->devices.size(), 0),
      remap_seen_(nvml_->devices.size(), false),
      retire_seen_(nvml_->devices.size(), false),
      lost_seen_(nvml_->devices.size(), false) {}

GpuHealth::~GpuHealth() = default;

void GpuHealth::raise(int gpu, const std::string& reason, int xid, int64_t now_ms) {
  spdlog::error("GPU {}: {}: it takes no more work until an admin clears it (ddlctl admin gpu-ok)", gpu,
                reason);
  if (faults_.count(gpu)) return;  // the first fault stands until cleared
  v1::GpuFault f;
  f.set_gpu(gpu);
  f.set_reason(reason);
  f.set_xid(xid);
  f.set_at_ms(now_ms);
  faults_[gpu] = f;
}

std::vector<v1::GpuFault> GpuHealth::poll(int64_t now_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  Nvml& n = *nvml_;
  // Xid events: all that are queued, without waiting.
  for (int drained = 0; n.events && drained < 1024; ++drained) {
    NvmlEventData data{};
    if (n.eventWait(n.events, &data, 0) != 0) break;
    const int gpu = n.indexOf(data.device);
    const int xid = static_cast<int>(data.eventData);
    if (gpu < 0) continue;
    if (std::string why = fatalXid(xid); !why.empty()) {
      raise(gpu, "Xid " + std::to_string(xid) + " (" + why + ")", xid, now_ms);
    } else {
      spdlog::warn("GPU {}: Xid {} (an error of the program using it, not of the GPU)", gpu, xid);
    }
  }
  for (size_t i = 0; i < n.devices.size(); ++i) {
    const int gpu = static_cast<int>(i);
    NvmlDevice d = n.devices[i];
    NvmlMemory mem{};
    const bool lost = n.memory && n.memory(d, &mem) == kGpuLost;
    if (lost && !lost_seen_[i]) raise(gpu, "fallen off the bus (NVML reports the GPU lost)", 0, now_ms);
    lost_seen_[i] = lost;
    if (lost) continue;
    unsigned long long ecc = 0;
    if (n.ecc && n.ecc(d, kUncorrected, kVolatile, &ecc) == 0) {
      if (ecc > ecc_seen_[i])
        raise(gpu,
              std::to_string(ecc) + " uncorrectable ECC error" + (ecc == 1 ? "" : "s") +
                  " since its last reset",
              0, now_ms);
      ecc_seen_[i] = ecc;
    }
    unsigned int corrected = 0, uncorrected = 0, pending = 0, failed = 0;
    if (n.remapped && n.remapped(d, &corrected, &uncorrected, &pending, &failed) == 0) {
      const bool bad = pending || failed;
      if (bad && !remap_seen_[i])
        raise(gpu, failed ? "row remapping failed" : "row remapping pending (the GPU needs a reset)", 0,
              now_ms);
      remap_seen_[i] = bad;
    }
    int retire = 0;
    if (n.retiredPending && n.retiredPending(d, &retire) == 0) {
      if (retire && !retire_seen_[i])
        raise(gpu, "pages pending retirement (the GPU needs a reset)", 0, now_ms);
      retire_seen_[i] = retire != 0;
    }
  }
  // Slowdowns (nvmlClocksEventReason bits): a hardware slowdown, thermal (software or hardware), a power
  // brake. The software power cap (0x4) is a busy GPU's normal state and is left out.
  std::string slow;
  for (size_t i = 0; n.clockReasons && i < n.devices.size(); ++i) {
    unsigned long long reasons = 0;
    if (lost_seen_[i] || n.clockReasons(n.devices[i], &reasons) != 0) continue;
    std::string why;
    for (auto [bit, name] : {std::pair{0x8ull, "HW slowdown"}, std::pair{0x20ull, "SW thermal slowdown"},
                             std::pair{0x40ull, "HW thermal slowdown"}, std::pair{0x80ull, "HW power brake"}})
      if (reasons & bit) why += (why.empty() ? "" : ", ") + std::string(name);
    if (!why.empty())
      slow += (slow.empty() ? "" : "; ") + ("GPU " + std::to_string(i) + " slowed down (" + why + ")");
  }
  if (slow != slowdown_ && !slow.empty()) spdlog::warn("{}", slow);
  slowdown_ = slow;
  std::vector<v1::GpuFault> out;
  for (const auto& [gpu, fault] : faults_) out.push_back(fault);
  return out;
}

std::string GpuHealth::slowdown() {
  std::lock_guard<std::mutex> lock(mu_);
  return slowdown_;
}

void GpuHealth::clear(int gpu) {
  std::lock_guard<std::mutex> lock(mu_);
  if (faults_.erase(gpu)) spdlog::info("GPU {}: cleared by an admin; it takes work again", gpu);
}

namespace {

std::string timedOut(double timeout_s) {
  char text[64];
  std::snprintf(text, sizeof(text), "no result within %g s (killed)", timeout_s);
  return text;
}

}  // namespace

std::string runHealthCheck(const std::string& program, double timeout_s) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return std::string("cannot run it: pipe: ") + std::strerror(errno);
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return std::string("cannot run it: fork: ") + std::strerror(errno);
  }
  if (pid == 0) {
    setpgid(0, 0);
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    const int null = ::open("/dev/null", O_RDONLY);
    if (null >= 0) dup2(null, 0);
    execl(program.c_str(), program.c_str(), static_cast<char*>(nullptr));
    dprintf(2, "cannot run %s: %s\n", program.c_str(), std::strerror(errno));
    _exit(127);
  }
  close(fds[1]);
  std::string output;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  bool timed_out = false;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000))) < 0 && errno != EINTR) break;
    if (!(p.revents & (POLLIN | POLLHUP))) continue;
    char buf[1024];
    const ssize_t got = read(fds[0], buf, sizeof(buf));
    if (got <= 0) break;  // the program closed its output: it ended (or closed it, and is waited for below)
    output.append(buf, static_cast<size_t>(got));
    if (output.size() > 64 * 1024) output.erase(0, output.size() - 64 * 1024);
  }
  close(fds[0]);
  int status = 0;
  if (timed_out) {
    kill(-pid, SIGKILL);
    waitpid(pid, &status, 0);
    return timedOut(timeout_s);
  }
  // Bounded: its output is closed; a program that closed it and goes on is killed at the deadline.
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() >= deadline) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      return timedOut(timeout_s);
    }
    usleep(10 * 1000);
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
  // Its last non-empty line, printable and at most 200 bytes.
  while (!output.empty() && (output.back() == '\n' || output.back() == ' ')) output.pop_back();
  std::string last = output.substr(output.rfind('\n') == std::string::npos ? 0 : output.rfind('\n') + 1);
  for (char& c : last)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  if (last.size() > 200) last = last.substr(0, 200) + "...";
  const std::string how = WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status))
                                            : "killed by signal " + std::to_string(WTERMSIG(status));
  return how + (last.empty() ? "" : ": " + last);
}

HealthCheck::HealthCheck(std::string program, double interval_s, double timeout_s) {
  std::thread([state = state_, program = std::move(program), interval_s, timeout_s] {
    std::unique_lock<std::mutex> lock(state->mu);
    while (!state->stop) {
      lock.unlock();
      const std::string failed = runHealthCheck(program, timeout_s);
      lock.lock();
      if (failed != state->failure) {
        if (failed.empty()) {
          spdlog::info("health check {} passes again", program);
        } else {
          spdlog::error("health check {} failed: {}", program, failed);
        }
      }
      state->failure = failed;
      state->cv.wait_for(lock, std::chrono::duration<double>(interval_s), [&] { return state->stop; });
    }
  }).detach();
}

HealthCheck::~HealthCheck() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
  }
  state_->cv.notify_all();
}

std::string HealthCheck::failure() {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->failure;
}

}  // namespace ddl::worker
