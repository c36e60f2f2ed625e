// NVML loaded at run time (nvml.h).
#include "worker/nvml.h"

#include <dlfcn.h>

namespace ddl::worker::nvml {

namespace {

template <class F>
void find(void* lib, F& f, const char* name) {
  f = reinterpret_cast<F>(dlsym(lib, name));
}

}  // namespace

std::unique_ptr<Library> Library::open(const std::string& path, std::string* why) {
  std::unique_ptr<Library> l(new Library());
  l->lib_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!l->lib_) {
    *why = path + " not found";
    return nullptr;
  }
  void* lib = l->lib_;
  find(lib, l->init, "nvmlInit_v2");
  find(lib, l->count, "nvmlDeviceGetCount_v2");
  find(lib, l->handle, "nvmlDeviceGetHandleByIndex_v2");
  if (!l->init || !l->count || !l->handle) {
    *why = path + " lacks the expected functions";
    return nullptr;
  }
  if (l->init() != 0) {
    *why = "nvmlInit failed (is the NVIDIA driver loaded?)";
    return nullptr;
  }
  find(lib, l->shutdown, "nvmlShutdown");  // only once init succeeded: the destructor calls it
  find(lib, l->name, "nvmlDeviceGetName");
  find(lib, l->uuid, "nvmlDeviceGetUUID");
  find(lib, l->memory, "nvmlDeviceGetMemoryInfo");
  find(lib, l->pci, "nvmlDeviceGetPciInfo_v3");
  find(lib, l->p2p, "nvmlDeviceGetP2PStatus");
  find(lib, l->eventSetCreate, "nvmlEventSetCreate");
  find(lib, l->eventSetFree, "nvmlEventSetFree");
  find(lib, l->registerEvents, "nvmlDeviceRegisterEvents");
  find(lib, l->eventWait, "nvmlEventSetWait_v2");
  find(lib, l->ecc, "nvmlDeviceGetTotalEccErrors");
  find(lib, l->remapped, "nvmlDeviceGetRemappedRows");
  find(lib, l->retiredPending, "nvmlDeviceGetRetiredPagesPendingStatus");
  find(lib, l->clockReasons, "nvmlDeviceGetCurrentClocksEventReasons");
  if (!l->clockReasons) find(lib, l->clockReasons, "nvmlDeviceGetCurrentClocksThrottleReasons");
  return l;
}

Library::~Library() {
  if (shutdown) shutdown();
  if (lib_) dlclose(lib_);
}

}  // namespace ddl::worker::nvml
