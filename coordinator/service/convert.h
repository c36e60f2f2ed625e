// Conversions between the coordinator's own records (state/, placement/) and the ddl.v1 messages. Pure
// functions; any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ddl/v1/ddl.pb.h"
#include "placement/cluster.h"
#include "placement/ring_layout.h"
#include "state/job.h"

namespace ddl::coordinator {

v1::JobState toProto(state::JobState s);
std::optional<state::JobState> fromProto(v1::JobState s);  // nullopt for JOB_STATE_UNSPECIFIED

state::JobSpec fromProto(const v1::JobSpec& spec);
void toProto(const state::JobSpec& spec, v1::JobSpec* out);
void toProto(const state::Failure& failure, v1::Failure* out);
// A rank's kept result as a RankStatus (progress only where one was heard), and back from an agent's report.
void toProto(const state::RankResult& rank, v1::RankStatus* out);
state::RankResult rankResultOf(const v1::RankStatus& rank, const std::string& node);

std::vector<state::NodeAllocation> toState(const placement::Allocation& allocation);
placement::Allocation toPlacement(const std::vector<state::NodeAllocation>& allocation);

// What placement needs to know of a job.
placement::JobRequest requestOf(const std::string& id, const state::JobSpec& spec);

void toProto(const placement::RingLayout& layout, v1::RingLayout* out);

// A node's state as placement sees it.
placement::NodeState toPlacement(state::NodeState s);
// What placement reads of a node's insides (placement/cluster.h), or null where its agent reported none.
std::shared_ptr<const placement::NodeTopology> topologyOf(const state::NodeRecord& record);

// A GPU as its agent reports it (unset topology fields read as unknown), and back; a GPU's fault.
state::GpuInfo fromProto(const v1::Gpu& gpu);
void toProto(const state::GpuInfo& gpu, v1::Gpu* out);
void toProto(int gpu, const state::GpuFault& fault, v1::GpuFault* out);

// When the latest attempt of a job reached `state` (STARTING: launched; RUNNING: what a time limit counts
// from); 0 if it never did, or the job was requeued since.
int64_t latestAttemptReached(const state::Job& job, state::JobState state);

// A job as users see it, from its record alone (the coordinator adds what only its loop knows).
v1::Job jobToProto(const state::Job& job);

// A duration in the coordinator's messages: 1500 ms -> "1.5 s".
std::string secondsText(int64_t ms);

}  // namespace ddl::coordinator
