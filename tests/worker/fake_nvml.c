// A stand-in for libnvidia-ml.so.1 with the NVML entry points ddl-agent's inventory calls, so that its
// reading of a real node's GPUs and their topology is tested where there is no GPU. The agent finds it by its
// usual dlopen("libnvidia-ml.so.1") when LD_LIBRARY_PATH names this library's directory.
//
// DDL_FAKE_NVML says what it reports: "BUS,BUS,...;A-B,C-D": one GPU per PCI bus number (hex, domain 0,
// device 0, function 0), and NVLink between each pair A-B. Every GPU reaches every other peer to peer.
//
// DDL_FAKE_NVML_FAULTS names a file a test writes faults into, one per line, read at each call:
//   xid GPU CODE   an Xid event (each line delivered once, in order, by nvmlEventSetWait_v2)
//   ecc GPU N      N uncorrectable volatile ECC errors
//   remap GPU      a row remap pending
//   lost GPU       the GPU has fallen off the bus (NVML_ERROR_GPU_IS_LOST from nvmlDeviceGetMemoryInfo)
//   slow GPU BITS  its clocks' event reasons (0x40: HW thermal slowdown)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_GPUS 16

struct pci_info {  // nvmlPciInfo_t
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};
struct memory_info {  // nvmlMemory_t
  unsigned long long total, free, used;
};

static int gpus;
static unsigned int buses[MAX_GPUS];
static int nvlink[MAX_GPUS][MAX_GPUS];

static int indexOf(void* device) { return (int)(size_t)device - 1; }

int nvmlInit_v2(void) {
  const char* spec = getenv("DDL_FAKE_NVML");
  gpus = 0;
  memset(nvlink, 0, sizeof(nvlink));
  if (!spec) return 0;
  const char* p = spec;
  while (*p && *p != ';' && gpus < MAX_GPUS) {
    char* end = NULL;
    buses[gpus++] = (unsigned int)strtoul(p, &end, 16);
    p = *end == ',' ? end + 1 : end;
  }
  if (*p == ';') ++p;
  while (*p) {
    char* end = NULL;
    const long a = strtol(p, &end, 10);
    if (*end != '-') break;
    const long b = strtol(end + 1, &end, 10);
    if (a >= 0 && a < gpus && b >= 0 && b < gpus) nvlink[a][b] = nvlink[b][a] = 1;
    p = *end == ',' ? end + 1 : end;
    if (!*end) break;
  }
  return 0;
}

int nvmlShutdown(void) { return 0; }

int nvmlDeviceGetCount_v2(unsigned int* count) {
  *count = (unsigned int)gpus;
  return 0;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void** device) {
  if ((int)index >= gpus) return 2;  // NVML_ERROR_INVALID_ARGUMENT
  *device = (void*)(size_t)(index + 1);
  return 0;
}

int nvmlDeviceGetName(void* device, char* name, unsigned int length) {
  (void)device;
  snprintf(name, length, "Fake P100-SXM2-16GB");
  return 0;
}

int nvmlDeviceGetUUID(void* device, char* uuid, unsigned int length) {
  snprintf(uuid, length, "GPU-fake-%d", indexOf(device));
  return 0;
}

// The value of the fault `kind` for GPU `gpu` in the faults file (the Nth such line for xid), or -1.
static long fault(const char* kind, int gpu, int nth) {
  const char* path = getenv("DDL_FAKE_NVML_FAULTS");
  FILE* f = path ? fopen(path, "r") : NULL;
  if (!f) return -1;
  char word[16];
  int g = 0, seen = 0;
  long value = -1, v = 0;
  char line[128];
  while (fgets(line, sizeof(line), f)) {
    const int n = sscanf(line, "%15s %d %ld", word, &g, &v);
    if (n < 2 || strcmp(word, kind) != 0 || (gpu >= 0 && g != gpu)) continue;
    if (strcmp(kind, "xid") == 0) {
      if (seen++ == nth) {
        value = (long)g << 32 | (v & 0xffffffff);
        break;
      }
      continue;
    }
    value = n == 3 ? v : 1;
  }
  fclose(f);
  return value;
}

static int xids_delivered;

int nvmlEventSetCreate(void** set) {
  *set = (void*)1;
  return 0;
}
int nvmlEventSetFree(void* set) {
  (void)set;
  return 0;
}
int nvmlDeviceRegisterEvents(void* device, unsigned long long types, void* set) {
  (void)device, (void)types, (void)set;
  return 0;
}

struct event_data {  // nvmlEventData_t
  void* device;
  unsigned long long eventType, eventData;
  unsigned int gpuInstanceId, computeInstanceId;
};

int nvmlEventSetWait_v2(void* set, struct event_data* data, unsigned int timeout_ms) {
  (void)set, (void)timeout_ms;
  const long x = fault("xid", -1, xids_delivered);
  if (x < 0) return 10;  // NVML_ERROR_TIMEOUT
  ++xids_delivered;
  memset(data, 0, sizeof(*data));
  data->device = (void*)(size_t)((x >> 32) + 1);
  data->eventType = 0x8;  // nvmlEventTypeXidCriticalError
  data->eventData = (unsigned long long)(x & 0xffffffff);
  return 0;
}

int nvmlDeviceGetTotalEccErrors(void* device, int type, int counter, unsigned long long* count) {
  (void)type, (void)counter;
  const long n = fault("ecc", indexOf(device), 0);
  *count = n > 0 ? (unsigned long long)n : 0;
  return 0;
}

int nvmlDeviceGetRemappedRows(void* device, unsigned int* corrected, unsigned int* uncorrected,
                              unsigned int* pending, unsigned int* failed) {
  *corrected = *uncorrected = *failed = 0;
  *pending = fault("remap", indexOf(device), 0) > 0;
  return 0;
}

int nvmlDeviceGetCurrentClocksEventReasons(void* device, unsigned long long* reasons) {
  const long bits = fault("slow", indexOf(device), 0);
  *reasons = bits > 0 ? (unsigned long long)bits : 0;
  return 0;
}

int nvmlDeviceGetMemoryInfo(void* device, struct memory_info* memory) {
  if (fault("lost", indexOf(device), 0) > 0) return 15;  // NVML_ERROR_GPU_IS_LOST
  memory->total = 16ull << 30;
  memory->free = memory->total;
  memory->used = 0;
  return 0;
}

int nvmlDeviceGetPciInfo_v3(void* device, struct pci_info* pci) {
  memset(pci, 0, sizeof(*pci));
  pci->bus = buses[indexOf(device)];
  snprintf(pci->busId, sizeof(pci->busId), "00000000:%02X:00.0", pci->bus);
  snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "0000:%02X:00.0", pci->bus);
  return 0;
}

// nvmlGpuP2PCapsIndex_t: 0 read, 2 NVLink; status 0 OK, 2 not supported (nvmlGpuP2PStatus_t).
int nvmlDeviceGetP2PStatus(void* a, void* b, int index, int* status) {
  const int i = indexOf(a), j = indexOf(b);
  *status = index == 2 ? (nvlink[i][j] ? 0 : 2) : 0;
  return 0;
}
