// ShmNode (shm_node.h): the node's segment made, announced and mapped; the members' counters, signatures and
// failure word; waits that spin, yield and sleep on a futex, polling the collective and the awaited member.
#include "transport/shm_node.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>

#include "error.h"

namespace ddl {

namespace {
constexpr uint64_t kMagic = 0x64646c2d73686d31ULL;  // "ddl-shm1"
// 2: sleepers on its own line, per-member reservation, one-shot rounds; 3: 8 signatures per member.
constexpr uint32_t kVersion = 3;
constexpr size_t kLineBytes = 128;  // one member's control line: its own pair of cache lines
constexpr size_t kPage = 4096;
constexpr int kSignatures = 8;
constexpr uint32_t kFailWriting = UINT32_MAX;
// How long a blocked wait sleeps before it looks again at the session, the failure word and the peer.
constexpr long kBlockNs = 1000 * 1000;

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__powerpc64__) || defined(__powerpc__)
  __asm__ __volatile__("or 27,27,27" ::: "memory");  // low thread priority while spinning (SMT)
#elif defined(__aarch64__)
  __asm__ __volatile__("yield" ::: "memory");
#endif
}

// Shared (not private) futexes: the word is in a MAP_SHARED mapping that other processes wait on too.
void futexWait(std::atomic<uint32_t>* word, uint32_t expected, long ns) {
  const timespec ts{0, ns};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

size_t roundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// The inode of this process's PID namespace (0 where /proc cannot say). Segment names carry it next to the
// creator's pid, so that a pid is only ever judged in the namespace it belongs to.
unsigned long long pidNamespace() {
  struct stat st {};
  return stat("/proc/self/ns/pid", &st) == 0 ? static_cast<unsigned long long>(st.st_ino) : 0;
}

// "/ddl-<pid namespace>-<creator's pid>-<64 random bits in hex>".
// Never throws (std::random_device may, where the kernel gives no entropy): then the clock and address space.
std::string randomName() {
  uint64_t r = 0;
  try {
    std::random_device rd;
    r = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  } catch (...) {
  }
  r ^= static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
       reinterpret_cast<uintptr_t>(&r);
  char buf[64];
  std::snprintf(buf, sizeof(buf), "/ddl-%llu-%d-%016llx", pidNamespace(), static_cast<int>(getpid()),
                static_cast<unsigned long long>(r));
  return buf;
}

// A creator killed before every member had attached leaves its segment's name in /dev/shm, and the segment's
// memory with it (nothing else unlinks it). Before making a segment, a creator removes those that are this
// user's, of its own PID namespace, and whose creator's process no longer exists. A creator that is alive
// (or a pid that has been reused) keeps its name; this process's own segments (other communicators) are left
// alone. Looks at no more than kMaxEntries names, so a crowded /dev/shm costs a bounded time. Never throws.
void removeOrphanedSegments() {
  constexpr int kMaxEntries = 65536;
  const unsigned long long ns = pidNamespace();
  if (ns == 0) return;
  DIR* dir = opendir("/dev/shm");
  if (!dir) return;
  const std::string prefix = "ddl-" + std::to_string(ns) + "-";
  const uid_t me = geteuid();
  int seen = 0;
  while (const dirent* e = readdir(dir)) {
    if (++seen > kMaxEntries) break;
    const char* name = e->d_name;
    if (std::strncmp(name, prefix.c_str(), prefix.size()) != 0) continue;
    char* end = nullptr;
    errno = 0;
    const long pid = std::strtol(name + prefix.size(), &end, 10);
    if (errno != 0 || end == name + prefix.size() || *end != '-' || pid <= 0 || pid > INT_MAX ||
        pid == getpid()) {
      continue;
    }
    struct stat st {};
    if (fstatat(dirfd(dir), name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) || st.st_uid != me) {
      continue;
    }
    if (kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    shm_unlink(("/" + std::string(name)).c_str());
  }
  closedir(dir);
}

std::string errnoText(const std::string& what) { return what + ": " + std::strerror(errno); }

}  // namespace

struct ShmNode::Header {
  uint64_t magic;
  uint32_t version;
  uint32_t members;
  uint64_t round_bytes;
  uint32_t buffers;
  std::atomic<uint32_t> attached;
  std::atomic<uint32_t> failed;  // 0, or the failing member's rank + 1 (kFailWriting while its text is written)
  char why[1024];
  // Members blocked on a futex: publishers wake only when non-zero. Read by every publish, so on a line of its
  // own.
  alignas(kLineBytes) std::atomic<uint32_t> sleepers;
};

struct ShmNode::Line {
  std::atomic<uint32_t> counter[3];
  std::atomic<uint32_t> pid;
  // The signatures of the member's last kSignatures collectives, by collective number. A broadcast's root
  // waits for no one but a free buffer, so it can be up to `buffers` collectives ahead of another member (one
  // round each); every other collective needs every member's data, so at most one. Buffers are fewer than
  // kSignatures (attach checks), so the one being checked is still there.
  std::atomic<uint64_t> signature[kSignatures];
};
static_assert(sizeof(ShmNode::Line) <= kLineBytes, "a control line fits its 128 bytes");
static_assert(sizeof(ShmNode::Header) <= kPage, "the header fits its page");
// Round g uses buffer g % buffers: continuous across the wrap of the 32-bit round counter only for powers of two.
constexpr bool powerOfTwo(int v) { return v > 0 && (v & (v - 1)) == 0; }
static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free,
              "atomics in shared memory must be lock-free (address-free)");

std::unique_ptr<ShmNode> ShmNode::attach(Store& store, const std::vector<int>& members, int rank,
                                         size_t round_bytes, int buffers, const Deadline& deadline,
                                         std::string* why) {
  std::unique_ptr<ShmNode> node(new ShmNode());
  node->members_ = members;
  const int n = static_cast<int>(members.size());
  for (int i = 0; i < n; ++i)
    if (members[i] == rank) node->me_ = i;
  // At step t a member copies round t in once every member consumed round t - buffers; consumption of round
  // t-2 comes at the end of step t, so 2 buffers would deadlock from the third round on.
  DDL_ASSERT(n >= 1 && members[node->me_] == rank && buffers >= 3 && buffers < kSignatures &&
             powerOfTwo(buffers));
  node->round_bytes_ = std::max<size_t>(64, round_bytes / n / 64 * 64) * n;
  node->buffers_ = buffers;
  node->lines_offset_ = kPage;
  node->data_offset_ = kPage + roundUp(n * kLineBytes, kPage);
  node->map_bytes_ = node->data_offset_ + static_cast<size_t>(n) * buffers * node->round_bytes_;

  const std::string key = "shm/" + std::to_string(members[0]);
  const bool creator = node->me_ == 0;
  int fd = -1;
  if (creator) {
    removeOrphanedSegments();
    node->name_ = randomName();
    fd = shm_open(node->name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    std::string err;
    void* p = MAP_FAILED;
    if (fd < 0) {
      err = errnoText("shm_open " + node->name_);
    } else if (ftruncate(fd, static_cast<off_t>(node->map_bytes_)) != 0) {
      err = errnoText("ftruncate");
    } else if (int e = posix_fallocate(fd, 0, static_cast<off_t>(node->data_offset_)); e != 0) {
      errno = e;
      err = errnoText("reserving the segment's header in /dev/shm");
    } else if ((p = mmap(nullptr, node->map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
      err = errnoText("mmap of " + std::to_string(node->map_bytes_) + " bytes");
    }
    if (fd >= 0) close(fd);
    if (!err.empty()) {
      if (fd >= 0) shm_unlink(node->name_.c_str());
      node->name_.clear();
      store.set(key, "error " + err);  // the other members fall back as well
      *why = err;
      return nullptr;
    }
    node->base_ = static_cast<char*>(p);
    new (node->base_) Header{kMagic, kVersion, static_cast<uint32_t>(n), node->round_bytes_,
                             static_cast<uint32_t>(buffers), {0}, {0}, {}, {0}};
    for (int i = 0; i < n; ++i) new (&node->line(i)) Line{};
    // Announced only once complete: the store's round trip orders it before any member's look.
    store.set(key, "name " + node->name_);
  } else {
    const std::string v = store.get(key, deadline);
    if (v.rfind("name ", 0) != 0) {
      *why = "rank " + std::to_string(members[0]) + " could not make the segment: " + v.substr(v.find(' ') + 1);
      return nullptr;
    }
    const std::string name = v.substr(5);
    fd = shm_open(name.c_str(), O_RDWR, 0600);
    if (fd < 0) {
      *why = errnoText("shm_open " + name);
      return nullptr;
    }
    struct stat st {};
    void* p = MAP_FAILED;
    if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != node->map_bytes_) {
      *why = "segment " + name + " has another size than this rank expects (different libddl settings?)";
    } else if ((p = mmap(nullptr, node->map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
      *why = errnoText("mmap of " + std::to_string(node->map_bytes_) + " bytes");
    }
    close(fd);
    if (p == MAP_FAILED) return nullptr;
    node->base_ = static_cast<char*>(p);
    node->name_ = name;
  }
  // Each member reserves its own slot's pages: the kernel places them on the NUMA node of the member that
  // writes them, and a full /dev/shm is an error here rather than a SIGBUS at the first touch.
  {
    const int fd2 = shm_open(node->name_.c_str(), O_RDWR, 0600);
    const off_t at = static_cast<off_t>(node->slot(node->me_, 0) - node->base_);
    const off_t len = static_cast<off_t>(node->round_bytes_ * buffers);
    const int e = fd2 < 0 ? errno : posix_fallocate(fd2, at, len);
    if (fd2 >= 0) close(fd2);
    if (e != 0) {
      errno = e;
      *why = errnoText("reserving " + std::to_string(len >> 20) + " MiB in /dev/shm");
      if (!creator) node->name_.clear();
      return nullptr;
    }
  }
  auto* h = reinterpret_cast<Header*>(node->base_);
  if (h->magic != kMagic || h->version != kVersion || h->members != static_cast<uint32_t>(n) ||
      h->round_bytes != node->round_bytes_ || h->buffers != static_cast<uint32_t>(buffers)) {
    *why = "segment " + node->name_ + " was made for another layout (different libddl versions or settings?)";
    node->name_.clear();
    return nullptr;
  }
  node->line(node->me_).pid.store(static_cast<uint32_t>(getpid()), std::memory_order_release);
  if (h->attached.fetch_add(1) + 1 == static_cast<uint32_t>(n)) {
    shm_unlink(node->name_.c_str());  // every member has it mapped: nothing to leave behind
    node->name_.clear();
  } else if (!creator) {
    node->name_.clear();  // the creator or the last member unlinks it
  }
  return node;
}

ShmNode::~ShmNode() {
  if (!name_.empty()) shm_unlink(name_.c_str());  // members that never came: unlink it anyway
  if (base_) munmap(base_, map_bytes_);
  for (int fd : pidfds_)
    if (fd >= 0) close(fd);
}

ShmNode::Line& ShmNode::line(int member) const {
  return *reinterpret_cast<Line*>(base_ + lines_offset_ + static_cast<size_t>(member) * kLineBytes);
}

char* ShmNode::slot(int member, int buf) const {
  return base_ + data_offset_ + (static_cast<size_t>(member) * buffers_ + buf) * round_bytes_;
}

void ShmNode::begin(uint64_t signature) {
  signature_ = signature;
  start_round_ = round_;
  ++collective_;
  line(me_).signature[collective_ % kSignatures].store(signature, std::memory_order_release);
}

void ShmNode::publish(Counter c, uint32_t value) {
  auto& word = line(me_).counter[c];
  word.store(value, std::memory_order_seq_cst);
  // Pairs with the waiter's increment of sleepers before its last look at the word (both seq_cst): either it
  // sees the new value, or this sees it asleep.
  if (reinterpret_cast<Header*>(base_)->sleepers.load(std::memory_order_seq_cst) != 0) futexWakeAll(&word);
}

void ShmNode::markFailed(const std::string& why) noexcept {
  auto* h = reinterpret_cast<Header*>(base_);
  uint32_t expected = 0;
  if (h->failed.compare_exchange_strong(expected, kFailWriting)) {
    const size_t n = std::min(why.size(), sizeof(h->why) - 1);
    std::memcpy(h->why, why.data(), n);
    h->why[n] = '\0';
    h->failed.store(static_cast<uint32_t>(rankOf(me_)) + 1, std::memory_order_release);
  }
  for (int m = 0; m < size(); ++m)
    for (auto& c : line(m).counter) futexWakeAll(&c);
}

void ShmNode::checkPeer(WaitContext& s, int member) {
  s.poll(rankOf(member));
  auto* h = reinterpret_cast<Header*>(base_);
  const uint32_t failed = h->failed.load(std::memory_order_acquire);
  if (failed != 0) {
    if (failed == kFailWriting) {
      fail(ddlRemoteError, "a rank on this node failed (shared memory)");
    }
    const int who = static_cast<int>(failed) - 1;
    if (who != rankOf(me_)) {
      fail(ddlRemoteError, s.peerName(who) + " failed: " + std::string(h->why) +
                               " (reported through shared memory)");
    }
  }
  if (!alive(member)) {
    fail(ddlRemoteError, s.peerName(rankOf(member)) + " died: its process " +
                             std::to_string(line(member).pid.load()) + " ended (noticed through shared memory)");
  }
}

void ShmNode::watchMembers() {
  if (!pidfds_.empty()) return;
  pidfds_.assign(size(), -1);
#ifdef SYS_pidfd_open
  for (int m = 0; m < size(); ++m) {
    const pid_t pid = static_cast<pid_t>(line(m).pid.load(std::memory_order_acquire));
    if (pid > 0 && pid != getpid()) pidfds_[m] = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  }
#endif
}

bool ShmNode::alive(int member) {
  const pid_t pid = static_cast<pid_t>(line(member).pid.load(std::memory_order_acquire));
  if (pid <= 0 || pid == getpid()) return true;  // not attached yet, or a thread of this process (tests)
  // A pidfd (opened by watchMembers once every member had attached, so a reused pid cannot pass for the
  // member) turns readable when the process ends, zombie or not; kill(pid, 0) where there is none (before
  // Linux 5.3, or a seccomp profile that refuses pidfd_open).
  watchMembers();
  if (const int fd = pidfds_[member]; fd >= 0) {
    pollfd p{fd, POLLIN, 0};
    return poll(&p, 1, 0) <= 0;  // an error of poll itself is no proof of death
  }
  return !(kill(pid, 0) != 0 && errno == ESRCH);
}

void ShmNode::waitOne(WaitContext& s, int member, Counter c, uint32_t target) {
  auto& word = line(member).counter[c];
  auto reached = [target](uint32_t v) { return static_cast<int32_t>(v - target) >= 0; };
  if (reached(word.load(std::memory_order_acquire))) return;
  auto* h = reinterpret_cast<Header*>(base_);
  int spins = 0, yields = 0;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (reached(word.load(std::memory_order_acquire))) return;
      cpuRelax();
    }
    if (spins < spin_rounds_) spins += 64;
    if (spins < spin_rounds_) {
      if ((spins & 4095) == 0) checkPeer(s, member);
      continue;
    }
    checkPeer(s, member);
    if (yields < yield_rounds_) {
      ++yields;
      sched_yield();
      continue;
    }
    h->sleepers.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t v = word.load(std::memory_order_seq_cst);
    if (!reached(v)) futexWait(&word, v, kBlockNs);
    h->sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
}

void ShmNode::waitAll(WaitContext& s, Counter c, uint32_t target) {
  // Targets at or before this collective's first round were reached in an earlier collective: a member may
  // not have begun this one yet, so its signature is not looked at.
  const bool this_collective = static_cast<int32_t>(target - start_round_) > 0;
  for (int m = 0; m < size(); ++m) {
    if (m == me_) continue;
    waitOne(s, m, c, target);
    if (this_collective &&
        line(m).signature[collective_ % kSignatures].load(std::memory_order_acquire) != signature_) {
      fail(ddlInvalidArgument, "collective mismatch: " + s.peerName(rankOf(m)) +
                                   " called a different collective, count, type, op or algorithm than this rank's " +
                                   s.describe() + " (shared memory); every rank must make the same calls in the "
                                   "same order");
    }
  }
}

}  // namespace ddl
