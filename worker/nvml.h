// NVML, the NVIDIA driver's management library, loaded at run time with dlopen so that the agent builds and
// runs on machines without the driver. The C entry points the agent uses are declared here, so no NVIDIA
// header is needed: NVML's stable C ABI (nvml.h), with opaque handles and 0 for success, and the structs and
// constants those calls take. inventory.cpp reads the GPUs and their topology through it, gpu_health.cpp
// their faults.
//
// Threads: a Library is opened and closed by one thread; its entry points are NVML's, which NVML documents as
// thread-safe.
#pragma once

#include <memory>
#include <string>

namespace ddl::worker::nvml {

using Device = void*;
using EventSet = void*;

struct Memory {  // nvmlMemory_t
  unsigned long long total, free, used;
};
struct PciInfo {  // nvmlPciInfo_t, as nvmlDeviceGetPciInfo_v3 fills it
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];  // "00000000:3B:00.0"
};
struct EventData {  // nvmlEventData_t
  Device device;
  unsigned long long eventType, eventData;
  unsigned int gpuInstanceId, computeInstanceId;
};

constexpr int kGpuLost = 15;                    // NVML_ERROR_GPU_IS_LOST
constexpr int kP2pRead = 0, kP2pNvlink = 2;     // nvmlGpuP2PCapsIndex_t (a status of 0 is OK)
constexpr unsigned long long kXidEvent = 0x8;   // nvmlEventTypeXidCriticalError
constexpr int kUncorrected = 1, kVolatile = 0;  // nvmlMemoryErrorType_t, nvmlEccCounterType_t

// The library, initialised (nvmlInit_v2) until destroyed (nvmlShutdown, dlclose). An entry point the driver
// lacks is null; the first four are always there.
struct Library {
  // `path`: "libnvidia-ml.so.1" (the loader's search, LD_LIBRARY_PATH included) or a file. Null, with why in
  // *why, where it cannot be loaded, lacks nvmlInit_v2 and the device count and handles, or does not
  // initialise.
  static std::unique_ptr<Library> open(const std::string& path, std::string* why);
  ~Library();
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;

  int (*count)(unsigned int*) = nullptr;               // nvmlDeviceGetCount_v2
  int (*handle)(unsigned int, Device*) = nullptr;      // nvmlDeviceGetHandleByIndex_v2
  int (*init)() = nullptr;                             // nvmlInit_v2
  int (*shutdown)() = nullptr;                         // nvmlShutdown
  int (*name)(Device, char*, unsigned int) = nullptr;  // nvmlDeviceGetName
  int (*uuid)(Device, char*, unsigned int) = nullptr;  // nvmlDeviceGetUUID
  int (*memory)(Device, Memory*) = nullptr;            // nvmlDeviceGetMemoryInfo
  int (*pci)(Device, PciInfo*) = nullptr;              // nvmlDeviceGetPciInfo_v3
  int (*p2p)(Device, Device, int, int*) = nullptr;     // nvmlDeviceGetP2PStatus
  int (*eventSetCreate)(EventSet*) = nullptr;
  int (*eventSetFree)(EventSet) = nullptr;
  int (*registerEvents)(Device, unsigned long long, EventSet) = nullptr;  // nvmlDeviceRegisterEvents
  int (*eventWait)(EventSet, EventData*, unsigned int) = nullptr;         // nvmlEventSetWait_v2
  int (*ecc)(Device, int, int, unsigned long long*) = nullptr;            // nvmlDeviceGetTotalEccErrors
  int (*remapped)(Device, unsigned int*, unsigned int*, unsigned int*, unsigned int*) = nullptr;
  int (*retiredPending)(Device, int*) = nullptr;  // nvmlDeviceGetRetiredPagesPendingStatus
  // nvmlDeviceGetCurrentClocksEventReasons (the older name ...ThrottleReasons where the driver is older).
  int (*clockReasons)(Device, unsigned long long*) = nullptr;

 private:
  Library() = default;
  void* lib_ = nullptr;
};

}  // namespace ddl::worker::nvml
