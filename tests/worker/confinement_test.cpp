// Confinement (worker/confinement.h) over a directory tree shaped like a delegated cgroup v2 (the files are
// plain files here, so what the agent writes can be read back), and the probe's answers where cgroups cannot
// be used. The kernel's side (a real cgroup2 with cpuset and memory) is exercised where the machine has one.
#include "worker/confinement.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace ddl::worker {
namespace {

namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class ConfinementTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ddl-confinement-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const fs::path& p, const std::string& text) {
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  fs::path dir_;
};

TEST_F(ConfinementTest, DelegatedCgroupGetsHolderAndRanksAndEachRankItsLimits) {
  const fs::path root = dir_ / "ddl-ranks.service";
  write(root / "cgroup.controllers", "cpuset cpu io memory pids\n");
  write(root / "cgroup.procs", std::to_string(getppid()) + "\n");  // the unit's placeholder
  Confinement c(Confinement::Options{root.string()});
  EXPECT_TRUE(c.cpuset());
  EXPECT_TRUE(c.memory());
  EXPECT_EQ(c.describe(), "cgroups v2 under " + root.string() + "/ranks: cpuset, memory.max");
  EXPECT_EQ(slurp(root / "holder" / "cgroup.procs"), std::to_string(getppid()));  // the placeholder left ROOT
  EXPECT_EQ(slurp(root / "cgroup.subtree_control"), "+cpuset +memory");
  EXPECT_EQ(slurp(root / "ranks" / "cgroup.subtree_control"), "+cpuset +memory");

  const std::string name = Confinement::rankName("j-000007", 2, 3);
  EXPECT_EQ(name, "j-000007-a2-r3");
  std::string error = "not cleared";
  const int fd = c.prepare(name, {4, 5, 6, 7, 9}, int64_t{8} << 30, &error, /*mems=*/{1});
  EXPECT_EQ(error, "");
  ASSERT_GE(fd, 0);
  close(fd);
  const fs::path rank = root / "ranks" / name;
  EXPECT_EQ(slurp(rank / "cpuset.cpus"), "4-7,9");
  EXPECT_EQ(slurp(rank / "cpuset.mems"), "1");  // its memory on its CPUs' NUMA node
  EXPECT_EQ(slurp(rank / "memory.max"), "8589934592");
  EXPECT_EQ(slurp(rank / "memory.oom.group"), "1");
  EXPECT_FALSE(fs::exists(rank / "memory.swap.max"));  // a kernel without swap accounting has none
  EXPECT_TRUE(fs::exists(rank / "cgroup.procs"));

  // With swap accounting, a rank over its memory is killed rather than swapped.
  const std::string swapped = Confinement::rankName("j-000007", 2, 4);
  write(root / "ranks" / swapped / "memory.swap.max", "max");
  const int fd2 = c.prepare(swapped, {}, 1 << 20, &error);
  ASSERT_GE(fd2, 0) << error;
  close(fd2);
  EXPECT_EQ(slurp(root / "ranks" / swapped / "memory.swap.max"), "0");
  // A cgroup that holds processes is a running rank's: a second start of that rank does not touch it.
  write(rank / "cgroup.events", "populated 1\nfrozen 0\n");
  EXPECT_EQ(c.prepare(name, {1}, 0, &error), -1);
  EXPECT_NE(error.find("holds processes already"), std::string::npos) << error;
  EXPECT_EQ(slurp(rank / "cpuset.cpus"), "4-7,9");
  EXPECT_EQ(c.prepare("../escape", {1}, 0, &error), -1);
  EXPECT_NE(error.find("cannot name a cgroup"), std::string::npos) << error;

  // The kernel's count of OOM kills is what finish() reports.
  write(rank / "memory.events", "low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\noom_group_kill 1\n");
  EXPECT_EQ(c.finish(name).oom_kills, 2);
  EXPECT_NE(c.finish(name).error.find("cannot remove " + rank.string()),
            std::string::npos);                        // files in it here
  EXPECT_EQ(c.finish("j-000008-a1-r0").oom_kills, 0);  // never made
  EXPECT_EQ(c.finish("j-000008-a1-r0").error, "");
  // ddl-ranks.service stopped and started with no rank left: systemd trimmed the empty cgroups and made ROOT
  // afresh. The next rank sets it up again instead of failing.
  fs::remove_all(root / "ranks");
  fs::remove_all(root / "holder");
  fs::remove(root / "cgroup.subtree_control");
  const int again = c.prepare(Confinement::rankName("j-000010", 1, 0), {2}, 0, &error);
  ASSERT_GE(again, 0) << error;
  close(again);
  EXPECT_EQ(slurp(root / "cgroup.subtree_control"), "+cpuset +memory");
  EXPECT_EQ(slurp(root / "ranks" / "cgroup.subtree_control"), "+cpuset +memory");
  EXPECT_EQ(slurp(root / "ranks" / "j-000010-a1-r0" / "cpuset.cpus"), "2");
  // Empty rank cgroups a previous agent left are swept at start; one in use (here: with files) stays.
  fs::create_directories(root / "ranks" / "j-000003-a1-r0");
  EXPECT_EQ(c.sweep(), 1);
  EXPECT_FALSE(fs::exists(root / "ranks" / "j-000003-a1-r0"));
  EXPECT_TRUE(fs::exists(root / "ranks" / "j-000010-a1-r0"));
  // A rank that asks for nothing gets no cgroup.
  EXPECT_EQ(c.prepare("j-000009-a1-r0", {}, 0, &error), -1);
  EXPECT_EQ(error, "");
  EXPECT_FALSE(fs::exists(root / "ranks" / "j-000009-a1-r0"));
}

TEST_F(ConfinementTest, OnlyTheControllersOfferedAreUsed) {
  const fs::path root = dir_ / "cg";
  write(root / "cgroup.controllers", "cpu io memory pids\n");
  Confinement c(Confinement::Options{root.string()});
  EXPECT_FALSE(c.cpuset());
  EXPECT_TRUE(c.memory());
  EXPECT_NE(c.describe().find("CPUs pinned with sched_setaffinity (no cpuset controller), memory.max"),
            std::string::npos)
      << c.describe();
  std::string error;
  const int fd = c.prepare("r", {1}, 1 << 20, &error);
  ASSERT_GE(fd, 0) << error;
  close(fd);
  EXPECT_FALSE(fs::exists(root / "ranks" / "r" / "cpuset.cpus"));
  EXPECT_EQ(slurp(root / "ranks" / "r" / "memory.max"), "1048576");
}

TEST_F(ConfinementTest, SaysWhyWhereCgroupsCannotBeUsed) {
  // cgroup v1 holds cpuset and memory (a hybrid host): the v2 tree offers neither.
  const fs::path hybrid = dir_ / "unified";
  write(hybrid / "cgroup.controllers", "hugetlb\n");
  Confinement a(Confinement::Options{hybrid.string()});
  EXPECT_FALSE(a.cpuset() || a.memory());
  EXPECT_NE(
      a.describe().find("offers neither the cpuset nor the memory controller (it has: hugetlb; cgroup v1 "
                        "may hold them); ranks are pinned to their CPUs with sched_setaffinity, their "
                        "memory is not limited"),
      std::string::npos)
      << a.describe();
  std::string error;
  EXPECT_EQ(a.prepare("r", {0}, 1 << 20, &error), -1);
  EXPECT_EQ(error, "");  // nothing to do: the supervisor pins CPUs, memory goes unlimited

  // By default, ddl-ranks.service's cgroup; where that unit does not run, no cgroups, and why.
  write(dir_ / "mountinfo", "30 1 0:26 / " + (dir_ / "cg2").string() + " rw,nosuid - cgroup2 cgroup2 rw\n");
  write(dir_ / "self", "0::/user.slice/session-1.scope\n");
  Confinement b(Confinement::Options{"", (dir_ / "mountinfo").string(), (dir_ / "self").string()});
  EXPECT_NE(b.describe().find("no delegated cgroup for ranks (" + (dir_ / "cg2").string() +
                              "/system.slice/ddl-ranks.service is missing: start ddl-ranks.service"),
            std::string::npos)
      << b.describe();
  write(dir_ / "cg2" / "system.slice" / "ddl-ranks.service" / "cgroup.controllers", "cpuset memory\n");
  Confinement found(Confinement::Options{"", (dir_ / "mountinfo").string(), (dir_ / "self").string()});
  EXPECT_TRUE(found.cpuset() && found.memory()) << found.describe();
  // Never the agent's own cgroup, nor one above it: the agent would have to leave it, and systemd could not
  // start the next agent there while confined ranks live. Nothing of it is touched.
  write(dir_ / "cg2" / "user.slice" / "cgroup.controllers", "cpuset memory\n");
  Confinement own(Confinement::Options{(dir_ / "cg2" / "user.slice").string(), (dir_ / "mountinfo").string(),
                                       (dir_ / "self").string()});
  EXPECT_NE(own.describe().find("holds the agent itself"), std::string::npos) << own.describe();
  EXPECT_FALSE(fs::exists(dir_ / "cg2" / "user.slice" / "holder"));
  // No cgroup2 mount at all.
  write(dir_ / "mountinfo1", "25 1 0:21 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n");
  Confinement d(Confinement::Options{"", (dir_ / "mountinfo1").string(), (dir_ / "self").string()});
  EXPECT_NE(d.describe().find("no cgroup2 file system is mounted"), std::string::npos) << d.describe();
  // Switched off.
  EXPECT_EQ(
      Confinement(Confinement::Options{"none"}).describe(),
      "cgroups not used (--cgroup-root none); ranks are pinned to their CPUs with sched_setaffinity, their "
      "memory is not limited");
  // A root the agent cannot write: probed, refused, said.
  if (geteuid() != 0) {
    const fs::path ro = dir_ / "ro";
    write(ro / "cgroup.controllers", "cpuset memory\n");
    fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
    Confinement e(Confinement::Options{ro.string()});
    EXPECT_NE(e.describe().find("not confined by cgroups: cannot create " + ro.string() + "/holder"),
              std::string::npos)
        << e.describe();
    fs::permissions(ro, fs::perms::owner_all);
  }
}

}  // namespace
}  // namespace ddl::worker
