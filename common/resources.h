// CPUs and memory as people and the kernel write them: CPU lists ("0-3,8,10-11", the kernel's cpulist form
// that cpuset.cpus and taskset take) and byte sizes ("512M", "8G", "1.5TiB"). One parser for ddlctl (a job's
// --mem-per-rank), the agent (--cpus, --memory) and the coordinator's messages.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ddl {

inline constexpr int kMaxCpuId = 65535;

// "" and *out set to the ascending, distinct ids; or why `text` is not a CPU list (a sentence without the
// text itself). Empty text is an empty list.
std::string parseCpuList(std::string_view text, std::vector<int>* out);
// Ascending runs as ranges: {0,1,2,3,8} -> "0-3,8"; the ids need not be sorted. {} -> "".
std::string formatCpuList(std::vector<int> cpus);

// "" and *bytes set; or why `text` is not a size. A number with an optional unit, binary as Slurm's --mem:
// K, M, G, T (also KB/KiB, ... in any case); no unit is bytes. Fractions are allowed with a unit ("1.5G").
// The size must be at least one byte and at most 1 PiB.
std::string parseByteSize(std::string_view text, int64_t* bytes);
// "8 GiB", "1.5 GiB", "512 MiB", "100 B": at most one decimal, the largest unit that keeps the number >= 1.
std::string formatBytes(int64_t bytes);
// GPU-hours as limits and their wait reasons print them: "5000", "0.25", "1000000" (at most three decimals,
// never an exponent).
std::string formatGpuHours(double hours);

}  // namespace ddl
