// ddlrun across machines: the hosts and slots of -H / --hostfile (as mpirun and horovodrun take them), the
// ranks each host runs, and the shell quoting of the command that starts ddlrun on a host over ssh. Pure
// functions; launcher.cpp does the processes.
#pragma once

#include <string>
#include <vector>

namespace ddl::launcher {

constexpr int kMaxHosts = 1024;

struct HostSlots {
  std::string host;  // a name or address every host can reach (rank 0's becomes DDL_ROOT's host)
  int slots = 1;     // ranks it may run
  bool operator==(const HostSlots&) const = default;
};

// The ranks one host runs: first_rank .. first_rank + ranks - 1.
struct HostPart {
  std::string host;
  int first_rank = 0;
  int ranks = 0;
  bool operator==(const HostPart&) const = default;
};

// -H: "a:4,b:4", or "a,a,b" (a host named again gets one more slot each time, as with mpirun). Appends to
// *hosts in first-seen order; "" or the error line ("ddlrun: ...").
std::string parseHostList(const std::string& text, std::vector<HostSlots>* hosts);
// --hostfile: one host per line, "a slots=4" (Open MPI's form), "a:4" or "a" (one slot); '#' starts a
// comment.
std::string parseHostfile(const std::string& text, const std::string& path, std::vector<HostSlots>* hosts);
// np ranks over the hosts in order, filling each host's slots before the next (mpirun's --map-by slot); hosts
// left without a rank are not in the plan. Requires 1 <= np <= the slots in all.
std::vector<HostPart> planHosts(const std::vector<HostSlots>& hosts, int np);
int totalSlots(const std::vector<HostSlots>& hosts);

// 'text' for a POSIX shell: single-quoted unless it is made of safe characters only.
std::string shellQuote(const std::string& text);

}  // namespace ddl::launcher
