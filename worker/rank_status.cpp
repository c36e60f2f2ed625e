// A Supervisor RankState as the RankStatus message the coordinator receives (rank_status.h).
#include "worker/rank_status.h"

namespace ddl::worker {

v1::RankStatus rankStatus(const RankState& s, const std::string& node) {
  v1::RankStatus r;
  r.set_job_id(s.job_id);
  r.set_attempt(s.attempt);
  r.set_rank(s.rank);
  r.set_gpu(s.gpu);
  r.set_pid(s.pid);
  r.set_program_pid(s.program_pid);
  r.set_node(node);
  r.set_state(s.running ? v1::RankStatus::RUNNING : v1::RankStatus::EXITED);
  if (!s.running) {
    if (s.signal) {
      r.set_signal(*s.signal);
    } else {
      r.set_exit_code(s.exit_code.value_or(Supervisor::kExitCodeUnknown));
    }
  }
  r.set_started_ms(s.started_ms);
  r.set_exited_ms(s.exited_ms);
  r.set_error(s.error);
  r.set_cpu_seconds(s.cpu_s);
  r.set_max_rss_bytes(s.max_rss_bytes);
  return r;
}

}  // namespace ddl::worker
