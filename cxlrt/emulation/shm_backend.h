// The emulated CXL pool: a shared file (under /dev/shm by default) whose
// pages are bound to one NUMA node with mbind before they are first touched,
// standing in for a CXL memory device. Registers itself as the emu://
// backend when the cxlrt_emulation library is linked (cxlrt::cxlrt does).
//
// A pool of devices=D is D files of equal size, mapped one after another
// into one address range; each device's pages are bound on their own
// (ChooseDeviceNodes), and the backend lists the devices in its info.
//
// The file is reserved in full at creation (fallocate), so a full /dev/shm is
// a clear kResourceExhausted and never a SIGBUS later, and pre-faulted
// (page faults cost 11-16 us each in the VMs we test on).
// Thread-safety as runtime::MemoryBackend.
#pragma once

#include <string>

#include "cxlrt/runtime/uri.h"

namespace cxlrt::emulation {

// The file that backs `uri` (emu:// only): DIR/cxlrt-NAME.pool with DIR from
// dir=, else CXLRT_SHM_DIR, else /dev/shm.
std::string ShmPoolPath(const runtime::PoolUri& uri);
// The file of device `device` of a pool of devices=D: device 0 is
// ShmPoolPath, device d > 0 DIR/cxlrt-NAME.devD.pool.
std::string ShmDevicePath(const runtime::PoolUri& uri, uint32_t device);
// The access model's shared state (device clocks): DIR/cxlrt-NAME.model.
std::string ShmModelPath(const runtime::PoolUri& uri);

// Makes sure the emu:// provider is registered (static registration does it
// too; this is for programs that link the library without the umbrella).
void RegisterShmBackend();

}  // namespace cxlrt::emulation
