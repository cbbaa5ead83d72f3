// The part of NIXL's backend plugin interface (plugin API version 1, as
// shipped in the `nixl` 1.5.1 wheels) that libplugin_CXLRT.so implements,
// declared here because the wheels carry no headers.
//
// This is an ABI, not a copy of NIXL's sources: what matters is the layout
// of each type the core library passes to a plugin and the order of the
// engine's virtual functions (27 slots: two destructor slots, then the
// methods in the order below). Names follow NIXL's API so that a reader can
// check each declaration against NIXL's documentation, and so that the
// plugin's symbols read like any other backend's. tests/nixl proves the
// declaration right by loading the plugin into the wheel's libnixl and
// moving data through it; docs/nixl.md says how the layout was checked
// against the wheel's own plugins (their vtables and constructors).
//
// Everything here is what NIXL's core (built with g++ and libstdc++'s C++11
// string ABI, like this project) passes across the plugin boundary:
// std::string, std::vector and std::unordered_map by reference. Nothing in
// this header may be reordered, and no member may be added to a class the
// core allocates or reads (nixlBackendEngine, the descriptor lists, the
// init parameters, the optional arguments).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

// --- Plain types (nixl_types.h). ---

enum nixl_mem_t { DRAM_SEG, VRAM_SEG, BLK_SEG, OBJ_SEG, FILE_SEG };
enum nixl_xfer_op_t { NIXL_READ, NIXL_WRITE };
enum nixl_status_t {
  NIXL_IN_PROG = 1,
  NIXL_SUCCESS = 0,
  NIXL_ERR_NOT_POSTED = -1,
  NIXL_ERR_INVALID_PARAM = -2,
  NIXL_ERR_BACKEND = -3,
  NIXL_ERR_NOT_FOUND = -4,
  NIXL_ERR_MISMATCH = -5,
  NIXL_ERR_NOT_ALLOWED = -6,
  NIXL_ERR_REPOST_ACTIVE = -7,
  NIXL_ERR_UNKNOWN = -8,
  NIXL_ERR_NOT_SUPPORTED = -9,
  NIXL_ERR_REMOTE_DISCONNECT = -10,
  NIXL_ERR_CANCELED = -11,
  NIXL_ERR_NO_TELEMETRY = -12,
};
enum class nixl_thread_sync_t { kNone, kStrict, kRw };
enum class nixl_cost_t { kAnalyticalBackend = 0 };

using nixl_backend_t = std::string;
using nixl_blob_t = std::string;  // bytes, not text
using nixl_mem_list_t = std::vector<nixl_mem_t>;
using nixl_b_params_t = std::unordered_map<std::string, std::string>;
using nixl_query_resp_t = std::optional<nixl_b_params_t>;
using nixlMemViewH = void*;
// The agent's optional arguments: only passed through by pointer
// (estimateXferCost), never read by this backend.
struct nixlAgentOptionalArgs;

// --- Descriptors (nixl_descriptors.h, backend_aux.h). ---

// A range of memory: address (or offset), length, device id. No vtable.
class nixlBasicDesc {
 public:
  uintptr_t addr;
  size_t len;
  uint64_t devId;
};

// A range the user registers, with its opaque metadata blob (for a remote
// range: what the owner's getPublicData returned).
class nixlBlobDesc : public nixlBasicDesc {
 public:
  nixl_blob_t metaInfo;
};

// The core's list of descriptors: a vtable (virtual destructor and
// resize), the memory type, then the vector. Only read here.
template <class T>
class nixlDescList {
 public:
  nixlDescList(const nixlDescList&) = delete;
  nixlDescList& operator=(const nixlDescList&) = delete;
  virtual ~nixlDescList();  // defined in libnixl; never called here
  virtual void resize(const size_t& count);
  nixl_mem_t getType() const { return type; }
  int descCount() const { return static_cast<int>(descs.size()); }
  const T& operator[](size_t i) const { return descs[i]; }

 protected:
  nixl_mem_t type;
  std::vector<T> descs;
};

// Per-backend metadata of a registered (local) or loaded (remote) range;
// backends derive from it. The core only stores the pointer and hands it
// back to deregisterMem / unloadMD.
class nixlBackendMD {
 public:
  explicit nixlBackendMD(bool is_private) : isPrivateMD(is_private) {}
  virtual ~nixlBackendMD() {}

 protected:
  bool isPrivateMD;
};

// A backend's transfer handle; backends derive from it.
class nixlBackendReqH {
 public:
  nixlBackendReqH() {}
  virtual ~nixlBackendReqH() {}
};

// A descriptor of a transfer: the range plus the metadata of the
// registration it lies in (what registerMem / loadRemoteMD returned).
class nixlMetaDesc : public nixlBasicDesc {
 public:
  nixlBackendMD* metadataP;
};
struct nixlRemoteMetaDesc : public nixlMetaDesc {
  std::string remoteAgent;
};
using nixl_meta_dlist_t = nixlDescList<nixlMetaDesc>;
using nixl_remote_meta_dlist_t = nixlDescList<nixlRemoteMetaDesc>;
using nixl_reg_dlist_t = nixlDescList<nixlBlobDesc>;

// (sender agent, message) pairs.
using notif_list_t = std::vector<std::pair<std::string, std::string>>;

// postXfer's options: the notification to deliver after the data.
struct nixlBackendOptionalArgs {
  nixl_blob_t notifMsg;
  bool hasNotif = false;
  nixl_blob_t customParam;
};
using nixl_opt_b_args_t = nixlBackendOptionalArgs;

// What the core hands a new engine. customParams: the user's backend
// parameters (the plugin's defaults when the user gave none).
class nixlBackendInitParams {
 public:
  std::string localAgent;
  nixl_backend_t type;
  nixl_b_params_t* customParams = nullptr;
  bool enableProgTh = false;
  uint64_t pthrDelay = 0;  // microseconds
  nixl_thread_sync_t syncMode;
  bool enableTelemetry_ = false;
};

// An event the core collects from an engine (getTelemetryEvents). This
// backend reports none, so the vector below stays empty and only the
// vector's own layout (three pointers) matters, not the event's fields.
struct nixlTelemetryEvent {
  uint32_t eventType;
  uint64_t value;
};

// --- The engine (backend_engine.h). ---

// The base class of every backend. The core calls the virtual methods
// through the vtable and the inline accessors below on the object itself,
// so both the slot order and the data members must be NIXL's.
class nixlBackendEngine {
 private:
  nixl_backend_t backendType;
  nixl_b_params_t customParams;
  std::vector<nixlTelemetryEvent> telemetryEvents_;
  std::mutex telemetryEventsMutex_;

 protected:
  bool initErr = false;  // set by a constructor that failed
  const std::string localAgent;
  const bool enableTelemetry_;

 public:
  explicit nixlBackendEngine(const nixlBackendInitParams* init_params)
      : backendType(init_params->type),
        customParams(*init_params->customParams),
        localAgent(init_params->localAgent),
        enableTelemetry_(init_params->enableTelemetry_) {}
  nixlBackendEngine(const nixlBackendEngine&) = delete;
  nixlBackendEngine& operator=(const nixlBackendEngine&) = delete;
  virtual ~nixlBackendEngine() = default;  // slots 0 and 1

  std::vector<nixlTelemetryEvent> getTelemetryEvents() {
    std::lock_guard<std::mutex> lock(telemetryEventsMutex_);
    return std::move(telemetryEvents_);
  }
  bool getInitErr() const noexcept { return initErr; }
  const nixl_backend_t& getType() const noexcept { return backendType; }
  const nixl_b_params_t& getCustomParams() const noexcept { return customParams; }

  virtual bool supportsRemote() const = 0;
  virtual bool supportsLocal() const = 0;
  virtual bool supportsNotif() const = 0;
  virtual nixl_mem_list_t getSupportedMems() const = 0;

  virtual nixl_status_t registerMem(const nixlBlobDesc& mem, const nixl_mem_t& nixl_mem,
                                    nixlBackendMD*& out) = 0;
  virtual nixl_status_t deregisterMem(nixlBackendMD* meta) = 0;

  virtual nixl_status_t connect(const std::string& remote_agent) = 0;
  virtual nixl_status_t disconnect(const std::string& remote_agent) = 0;
  virtual nixl_status_t unloadMD(nixlBackendMD* input) = 0;

  virtual nixl_status_t prepXfer(const nixl_xfer_op_t& operation, const nixl_meta_dlist_t& local,
                                 const nixl_meta_dlist_t& remote, const std::string& remote_agent,
                                 nixlBackendReqH*& handle,
                                 const nixl_opt_b_args_t* opt_args = nullptr) const = 0;
  virtual nixl_status_t postXfer(const nixl_xfer_op_t& operation, const nixl_meta_dlist_t& local,
                                 const nixl_meta_dlist_t& remote, const std::string& remote_agent,
                                 nixlBackendReqH*& handle,
                                 const nixl_opt_b_args_t* opt_args = nullptr) const = 0;
  virtual nixl_status_t checkXfer(nixlBackendReqH* handle) const = 0;
  virtual nixl_status_t releaseReqH(nixlBackendReqH* handle) const = 0;

  virtual nixl_status_t prepMemView(const nixl_remote_meta_dlist_t&, nixlMemViewH&,
                                    const nixl_opt_b_args_t* = nullptr) const {
    return NIXL_ERR_NOT_SUPPORTED;
  }
  virtual nixl_status_t prepMemView(const nixl_meta_dlist_t&, nixlMemViewH&,
                                    const nixl_opt_b_args_t* = nullptr) const {
    return NIXL_ERR_NOT_SUPPORTED;
  }
  virtual void releaseMemView(nixlMemViewH) const {}

  virtual nixl_status_t getPublicData(const nixlBackendMD*, std::string&) const {
    return NIXL_ERR_BACKEND;
  }
  virtual nixl_status_t getConnInfo(std::string&) const { return NIXL_ERR_BACKEND; }
  virtual nixl_status_t loadRemoteConnInfo(const std::string&, const std::string&) {
    return NIXL_ERR_BACKEND;
  }
  virtual nixl_status_t loadRemoteMD(const nixlBlobDesc&, const nixl_mem_t&, const std::string&,
                                     nixlBackendMD*&) {
    return NIXL_ERR_BACKEND;
  }
  virtual nixl_status_t loadLocalMD(nixlBackendMD*, nixlBackendMD*&) { return NIXL_ERR_BACKEND; }

  virtual nixl_status_t getNotifs(notif_list_t&) { return NIXL_ERR_BACKEND; }
  virtual nixl_status_t genNotif(const std::string&, const std::string&) const {
    return NIXL_ERR_BACKEND;
  }

  virtual nixl_status_t queryMem(const nixl_reg_dlist_t&, std::vector<nixl_query_resp_t>&) const {
    return NIXL_ERR_NOT_SUPPORTED;
  }
  virtual nixl_status_t estimateXferCost(const nixl_xfer_op_t&, const nixl_meta_dlist_t&,
                                         const nixl_meta_dlist_t&, const std::string&,
                                         nixlBackendReqH* const&, std::chrono::microseconds&,
                                         std::chrono::microseconds&, nixl_cost_t&,
                                         const nixlAgentOptionalArgs* = nullptr) const {
    return NIXL_ERR_NOT_SUPPORTED;
  }
};

// --- The plugin (backend_plugin.h). ---

// The version the core checks nixl_plugin_init's answer against.
inline constexpr int kNixlPluginApiVersion = 1;

// What nixl_plugin_init returns: plain data and function pointers.
struct nixlBackendPlugin {
  int api_version;
  nixlBackendEngine* (*create_engine)(const nixlBackendInitParams* init_params);
  void (*destroy_engine)(nixlBackendEngine* engine);
  const char* (*get_plugin_name)();
  const char* (*get_plugin_version)();
  nixl_b_params_t (*get_backend_options)();
  nixl_mem_list_t (*get_backend_mems)();
};

// The layout facts read off the 1.5.1 wheel (docs/nixl.md, "The plugin
// interface"): what its plugins' code reads at these offsets.
static_assert(sizeof(nixlBasicDesc) == 24 && sizeof(nixlBlobDesc) == 56);
static_assert(sizeof(nixlMetaDesc) == 32);
static_assert(offsetof(nixlBackendOptionalArgs, hasNotif) == 0x20);
static_assert(offsetof(nixlBackendInitParams, type) == 0x20);
static_assert(offsetof(nixlBackendInitParams, customParams) == 0x40);
static_assert(offsetof(nixlBackendInitParams, enableProgTh) == 0x48);
static_assert(offsetof(nixlBackendInitParams, pthrDelay) == 0x50);
static_assert(offsetof(nixlBackendInitParams, syncMode) == 0x58);
static_assert(offsetof(nixlBackendInitParams, enableTelemetry_) == 0x5c);
static_assert(sizeof(nixlBackendPlugin) == 56);
