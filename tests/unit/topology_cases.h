// The topology texts every caller of the one grammar (common/topology_dims.h) is fed: libddl's DDL_TOPOLOGY
// (topology_test.cpp), the coordinator's job topology (placement_test.cpp), ddlctl submit --topology
// (ddlctl_format_test.cpp) and ddlrun --topology (ddlrun_test.cpp). Each must accept exactly the cases marked
// ok, for `ranks` ranks.
#pragma once

struct TopologyCase {
  const char* text;
  int ranks;
  bool ok;
};

inline constexpr TopologyCase kTopologyCases[] = {
    {"8", 8, true},
    {"4x2", 8, true},
    {"4X2", 8, true},  // ddlctl refused it while libddl and the coordinator took it
    {"2x2x2", 8, true},
    {"1x8", 8, true},
    {"008", 8, true},
    {"1x1x1x1x1x1x1x1x1x1x1x1x1x1x1x2", 2, true},     // 16 dims
    {"1x1x1x1x1x1x1x1x1x1x1x1x1x1x1x1x2", 2, false},  // 17
    {"4x2", 6, false},                                // the product is not the rank count
    {"4x", 4, false},
    {"x4", 4, false},
    {"4xx2", 8, false},
    {"4*2", 8, false},
    {"4 x 2", 8, false},
    {" 8", 8, false},
    {"0x8", 8, false},
    {"-2x-4", 8, false},
    {"2.0x4", 8, false},
    {"a", 1, false},
    {"1048577", 8, false},  // one dim above 2^20
    {"99999999999999999999", 8, false},
};
