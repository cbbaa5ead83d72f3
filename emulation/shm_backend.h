// The emulated CXL pool: a shared file (under /dev/shm by default) whose
// pages are bound to one NUMA node with mbind before they are first touched,
// standing in for a CXL memory device. Registers itself as the emu://
// backend when the cxlrt_emulation library is linked (cxlrt::cxlrt does).
//
// The file is reserved in full at creation (fallocate), so a full /dev/shm is
// a clear kResourceExhausted and never a SIGBUS later, and pre-faulted
// (page faults cost 11-16 us each in the VMs we test on).
// Thread-safety as runtime::MemoryBackend.
#pragma once

#include <string>

#include "runtime/config.h"
#include "runtime/uri.h"

namespace cxlrt::emulation {

// The file that backs `uri` (emu:// only): DIR/cxlrt-NAME.pool with DIR from
// dir=, else CXLRT_SHM_DIR, else /dev/shm.
std::string ShmPoolPath(const runtime::PoolUri& uri);

// Makes sure the emu:// provider is registered (static registration does it
// too; this is for programs that link the library without the umbrella).
void RegisterShmBackend();

}  // namespace cxlrt::emulation
