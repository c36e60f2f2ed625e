// GPU faults from NVML and the site's health check program (gpu_health.h).
#include "worker/gpu_health.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "worker/nvml.h"

namespace ddl::worker {

// The library and what is opened of it for the agent's life: the node's devices (null where NVML gives no
// handle) and the Xid event set (null where the driver has none).
struct GpuHealth::Nvml {
  std::unique_ptr<nvml::Library> lib;
  std::vector<nvml::Device> devices;
  nvml::EventSet events = nullptr;

  ~Nvml() {
    if (events && lib->eventSetFree) lib->eventSetFree(events);  // before the library's shutdown
  }
  int indexOf(nvml::Device d) const {
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

std::unique_ptr<GpuHealth> GpuHealth::open(int gpus, const std::string& library) {
  if (gpus <= 0) return nullptr;
  auto nv = std::make_unique<Nvml>();
  std::string why;
  nv->lib = nvml::Library::open(library, &why);
  if (!nv->lib) return nullptr;
  nvml::Library& lib = *nv->lib;
  // A GPU NVML gives no handle for keeps its place as a null device, and is reported lost (the inventory
  // keeps its index the same way).
  for (int i = 0; i < gpus; ++i) {
    nvml::Device d = nullptr;
    if (lib.handle(static_cast<unsigned int>(i), &d) != 0) d = nullptr;
    nv->devices.push_back(d);
  }
  if (lib.eventSetCreate && lib.registerEvents && lib.eventWait && lib.eventSetCreate(&nv->events) == 0) {
    for (size_t i = 0; i < nv->devices.size(); ++i) {
      // A GPU that cannot report Xids (some do not) is still polled for the rest.
      if (nv->devices[i] && lib.registerEvents(nv->devices[i], nvml::kXidEvent, nv->events) != 0)
        spdlog::warn("GPU {}: NVML gives no Xid events for it; its ECC and remap counters are still watched",
                     i);
    }
  } else {
    nv->events = nullptr;
  }
  return std::unique_ptr<GpuHealth>(new GpuHealth(std::move(nv)));
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
  // NVML is read without holding mu_ (a GPU falling off the bus can make a call take seconds: the heartbeat
  // reads faults() meanwhile); what was read is applied under it.
  std::lock_guard<std::mutex> polling(poll_mu_);
  Nvml& n = *nvml_;
  nvml::Library& lib = *n.lib;
  std::vector<std::pair<int, int>> xids;  // (GPU, Xid)
  for (int drained = 0; n.events && drained < 1024; ++drained) {
    nvml::EventData data{};
    if (lib.eventWait(n.events, &data, 0) != 0) break;
    if (const int gpu = n.indexOf(data.device); gpu >= 0)
      xids.emplace_back(gpu, static_cast<int>(data.eventData));
  }
  struct Reading {
    bool lost = false;
    bool eccRead = false;
    unsigned long long ecc = 0;
    bool remap = false, remapFailed = false, retire = false;
    unsigned long long reasons = 0;
  };
  std::vector<Reading> read(n.devices.size());
  for (size_t i = 0; i < n.devices.size(); ++i) {
    nvml::Device d = n.devices[i];
    Reading& r = read[i];
    nvml::Memory mem{};
    r.lost = !d || (lib.memory && lib.memory(d, &mem) == nvml::kGpuLost);
    if (r.lost) continue;
    r.eccRead = lib.ecc && lib.ecc(d, nvml::kUncorrected, nvml::kVolatile, &r.ecc) == 0;
    unsigned int corrected = 0, uncorrected = 0, pending = 0, failed = 0;
    if (lib.remapped && lib.remapped(d, &corrected, &uncorrected, &pending, &failed) == 0) {
      r.remap = pending || failed;
      r.remapFailed = failed != 0;
    }
    int retire = 0;
    r.retire = lib.retiredPending && lib.retiredPending(d, &retire) == 0 && retire != 0;
    if (lib.clockReasons && lib.clockReasons(d, &r.reasons) != 0) r.reasons = 0;
  }

  std::lock_guard<std::mutex> lock(mu_);
  for (auto [gpu, xid] : xids) {
    if (std::string why = fatalXid(xid); !why.empty()) {
      raise(gpu, "Xid " + std::to_string(xid) + " (" + why + ")", xid, now_ms);
    } else {
      spdlog::warn("GPU {}: Xid {} (an error of the program using it, not of the GPU)", gpu, xid);
    }
  }
  std::string slow;
  for (size_t i = 0; i < read.size(); ++i) {
    const int gpu = static_cast<int>(i);
    const Reading& r = read[i];
    // Conditions (lost, a remap, pages to retire) are raised when they appear, and again after a clear while
    // they last. The ECC count is a counter: raised when it rises past what the first reading found (a
    // count from before the agent started is the GPU's history since its last reset, not news).
    if (r.lost && !lost_seen_[i])
      raise(gpu, n.devices[i] ? "fallen off the bus (NVML reports the GPU lost)" : "NVML cannot reach it", 0,
            now_ms);
    lost_seen_[i] = r.lost;
    if (r.eccRead) {
      if (ecc_primed_ && r.ecc > ecc_seen_[i])
        raise(gpu,
              std::to_string(r.ecc) + " uncorrectable ECC error" + (r.ecc == 1 ? "" : "s") +
                  " since its last reset",
              0, now_ms);
      ecc_seen_[i] = std::max(ecc_seen_[i], r.ecc);
    }
    if (r.remap && !remap_seen_[i])
      raise(gpu, r.remapFailed ? "row remapping failed" : "row remapping pending (the GPU needs a reset)", 0,
            now_ms);
    remap_seen_[i] = r.remap;
    if (r.retire && !retire_seen_[i])
      raise(gpu, "pages pending retirement (the GPU needs a reset)", 0, now_ms);
    retire_seen_[i] = r.retire;
    // Slowdowns (nvmlClocksEventReason bits): a hardware slowdown, thermal (software or hardware), a power
    // brake. The software power cap (0x4) is a busy GPU's normal state and is left out.
    std::string why;
    for (auto [bit, name] : {std::pair{0x8ull, "HW slowdown"}, std::pair{0x20ull, "SW thermal slowdown"},
                             std::pair{0x40ull, "HW thermal slowdown"}, std::pair{0x80ull, "HW power brake"}})
      if (r.reasons & bit) why += (why.empty() ? "" : ", ") + std::string(name);
    if (!why.empty())
      slow += (slow.empty() ? "" : "; ") + ("GPU " + std::to_string(i) + " slowed down (" + why + ")");
  }
  ecc_primed_ = true;
  if (slow != slowdown_ && !slow.empty()) spdlog::warn("{}", slow);
  slowdown_ = slow;
  return faultsLocked();
}

std::vector<v1::GpuFault> GpuHealth::faultsLocked() const {
  std::vector<v1::GpuFault> out;
  for (const auto& [gpu, fault] : faults_) out.push_back(fault);
  return out;
}

std::vector<v1::GpuFault> GpuHealth::faults() {
  std::lock_guard<std::mutex> lock(mu_);
  return faultsLocked();
}

std::string GpuHealth::slowdown() {
  std::lock_guard<std::mutex> lock(mu_);
  return slowdown_;
}

void GpuHealth::clear(int gpu) {
  std::lock_guard<std::mutex> lock(mu_);
  if (faults_.erase(gpu)) spdlog::info("GPU {}: cleared by an admin; it takes work again", gpu);
  // A condition that is still there (a remap pending after a reset that did not take) is raised again.
  if (gpu >= 0 && static_cast<size_t>(gpu) < remap_seen_.size())
    remap_seen_[gpu] = retire_seen_[gpu] = lost_seen_[gpu] = false;
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
  // Prepared before fork: the child of a threaded process may call only async-signal-safe functions.
  const std::string cannot = "cannot run " + program + "\n";
  const char* path = program.c_str();
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return std::string("cannot run it: fork: ") + std::strerror(errno);
  }
  if (pid == 0) {
    // As the supervisor does for ranks: the program starts with default signals and an empty mask (the
    // agent blocks SIGTERM and SIGINT: a site script's own `timeout` must work), and none of the agent's
    // descriptors.
    setpgid(0, 0);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    for (int sig = 1; sig < NSIG; ++sig)
      if (sig != SIGKILL && sig != SIGSTOP) sigaction(sig, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    const int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null >= 0) dup2(null, 0);  // dup2 clears close-on-exec on the copy
#ifdef SYS_close_range
    syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC);
#endif
    execl(path, path, static_cast<char*>(nullptr));
    if (write(2, cannot.data(), cannot.size()) < 0) _exit(127);
    _exit(127);
  }
  setpgid(pid, pid);  // also here: a timeout before the child ran its own must still reach its group
  close(fds[1]);
  std::string output;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int status = 0;
  bool exited = false;
  // Until it exits (or the deadline): its output read as it comes. A program that exits while a child of
  // its own keeps the output open is done: what is left is read without waiting.
  while (!exited) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fds[0], POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 50)));
    if (ready > 0 && (p.revents & (POLLIN | POLLHUP))) {
      char buf[1024];
      const ssize_t got = read(fds[0], buf, sizeof(buf));
      if (got > 0) output.append(buf, static_cast<size_t>(got));
      if (output.size() > 64 * 1024) output.erase(0, output.size() - 64 * 1024);
    }
    exited = waitpid(pid, &status, WNOHANG) == pid;
  }
  if (!exited) {
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    close(fds[0]);
    return timedOut(timeout_s);
  }
  fcntl(fds[0], F_SETFL, O_NONBLOCK);
  for (char buf[1024];;) {
    const ssize_t got = read(fds[0], buf, sizeof(buf));
    if (got <= 0) break;
    output.append(buf, static_cast<size_t>(got));
    if (output.size() > 64 * 1024) output.erase(0, output.size() - 64 * 1024);
  }
  close(fds[0]);
  kill(-pid, SIGKILL);  // what it left running in its group: a check leaves nothing behind
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
      if (!state->failure || failed != *state->failure) {
        if (failed.empty()) {
          spdlog::info("health check {} passes{}", program, state->failure ? " again" : "");
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

std::optional<std::string> HealthCheck::failure() {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->failure;
}

}  // namespace ddl::worker
