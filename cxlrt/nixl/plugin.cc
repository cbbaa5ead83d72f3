// libplugin_CXLRT.so's entry points: what NIXL's plugin manager looks up
// after dlopen(RTLD_NOW | RTLD_LOCAL) (docs/nixl.md). Only these two symbols
// are exported (plugin.map); everything else, cxlrt's libraries included,
// stays inside the plugin.
#include "cxlrt/nixl/engine.h"

namespace cxlrt::nixl {
namespace {

nixlBackendEngine* CreateEngine(const nixlBackendInitParams* params) {
  try {
    return new CxlrtEngine(params);
  } catch (const std::exception& e) {
    return nullptr;
  }
}

void DestroyEngine(nixlBackendEngine* engine) { delete engine; }

const char* PluginName() { return "CXLRT"; }
const char* PluginVersion() { return "0.1.0"; }

// The backend's parameters and their defaults: `pool`, the pool's URI
// ("": the CXLRT_POOL variable).
nixl_b_params_t BackendOptions() { return {{"pool", ""}}; }

// What the plugin can move in this process: VRAM only with a GPU (the
// engine says the same once made).
nixl_mem_list_t BackendMems() { return {DRAM_SEG, VRAM_SEG}; }

#ifndef CXLRT_NIXL_REPORTED_API_VERSION
#define CXLRT_NIXL_REPORTED_API_VERSION kNixlPluginApiVersion
#endif
nixlBackendPlugin plugin = {CXLRT_NIXL_REPORTED_API_VERSION,
                            CreateEngine,
                            DestroyEngine,
                            PluginName,
                            PluginVersion,
                            BackendOptions,
                            BackendMems};

}  // namespace
}  // namespace cxlrt::nixl

extern "C" {
__attribute__((visibility("default"))) nixlBackendPlugin* nixl_plugin_init() {
  return &cxlrt::nixl::plugin;
}
__attribute__((visibility("default"))) void nixl_plugin_fini() {}
}
