// The vocabulary of libddl's settings, shared by every floor of comm/src: the names of the algorithm and
// device-scheme choices, the environment's values (getEnv), and the number parsers every DDL_* variable goes
// through. Reading a communicator's whole Options from ddlConfig_t and the environment is options.h's, on the
// top floor. Threads: pure functions (getEnv reads the environment, which libddl never writes).
#pragma once

#include <string>

namespace ddl {

// kShm: every rank on one node, over the node's shared memory (algo/shm.cpp).
enum class Algo { kAuto, kRing, kMdRing, kRhd, kShm };
const char* algoName(Algo a);
Algo parseAlgo(const std::string& name);  // throws ddlInvalidArgument listing the valid names

// How stream-ordered device collectives of one node meet (device/stream_path.h): kAuto chooses the node
// kernel where every rank has a GPU of its own or MPS shares one, else the host-paced path; the others force
// one.
enum class DeviceScheme { kAuto, kKernel, kHost };
const char* deviceSchemeName(DeviceScheme s);

// Environment helpers: the value, or empty when unset.
std::string getEnv(const char* name);
// Parses a decimal integer in [lo, hi]; throws ddlInvalidArgument naming what and the text.
long long parseInt(const std::string& text, const char* what, long long lo, long long hi);
// A byte count, optionally with a K, M or G suffix (powers of 1024), in [lo, hi]; throws ddlInvalidArgument
// naming what.
long long parseByteCount(const std::string& text, const char* what, long long lo, long long hi);

}  // namespace ddl
