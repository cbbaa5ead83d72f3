// The CXLRT backend: opening the pool, the region, registrations, public
// data and connection info, peers and channels; the NIXL entry points.
#include "cxlrt/nixl/engine.h"

#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cxlrt/gpu/dma_engine.h"
#include "cxlrt/gpu/gpu.h"
#include "cxlrt/runtime/log.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::nixl {
namespace {

constexpr uint64_t kConnMagic = 0x314e4e4354584c43ull;  // "CLXTCNN1"
constexpr uint64_t kRegMagic = 0x3147455254584c43ull;   // "CLXTREG1"

// What getConnInfo returns: the pool's identity and where this engine's
// region is. Never a process id: peers may be on other machines.
struct ConnWire {
  uint64_t magic;
  uint64_t pool_creation_id;
  uint64_t pool_size;
  uint64_t engine_id;
  uint64_t epoch;
  PoolOffset region;
  uint32_t slot;
  uint32_t name_len;
  char name[kMaxName];
};

// What getPublicData returns for a registration.
struct RegWire {
  uint64_t magic;
  uint64_t engine_id;
  uint64_t id;
  uint64_t key;
  uint64_t addr;
  uint64_t len;
  PoolOffset pool_off;
  uint32_t mem;
  uint32_t reserved;
};

template <typename T>
std::string ToBytes(const T& v) {
  return std::string(reinterpret_cast<const char*>(&v), sizeof(T));
}

template <typename T>
bool FromBytes(const std::string& s, T* v) {
  if (s.size() != sizeof(T)) return false;
  std::memcpy(v, s.data(), sizeof(T));
  return true;
}

uint64_t RandomId() {
  static std::mutex mu;
  static std::mt19937_64 gen{std::random_device{}()};
  std::lock_guard<std::mutex> l(mu);
  uint64_t v = 0;
  while (v == 0) v = gen();
  return v;
}

nixl_status_t ToNixl(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk:
      return NIXL_SUCCESS;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return NIXL_ERR_INVALID_PARAM;
    case absl::StatusCode::kNotFound:
      return NIXL_ERR_NOT_FOUND;
    case absl::StatusCode::kFailedPrecondition:
      return NIXL_ERR_MISMATCH;
    case absl::StatusCode::kUnimplemented:
      return NIXL_ERR_NOT_SUPPORTED;
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kUnavailable:
      return NIXL_ERR_REMOTE_DISCONNECT;
    default:
      return NIXL_ERR_BACKEND;
  }
}

}  // namespace

// --- Engine: opening, region, registrations. ---

absl::StatusOr<std::unique_ptr<Engine>> Engine::Open(const std::string& agent,
                                                     const std::string& uri) {
  std::unique_ptr<Engine> e(new Engine());
  CXLRT_RETURN_IF_ERROR(e->Start(agent, uri));
  return e;
}

absl::Status Engine::Start(const std::string& agent, const std::string& uri) {
  if (agent.empty() || agent.size() > kMaxName) {
    return absl::InvalidArgumentError(absl::StrCat("NIXL agent name '", agent, "' has ",
                                                   agent.size(), " bytes (1 to ", kMaxName,
                                                   " allowed by the CXLRT backend)"));
  }
  agent_ = agent;
  HostOptions options;
  options.create = true;  // a URI with size= makes the pool when it is missing
  CXLRT_ASSIGN_OR_RETURN(Host host, Host::Open(uri, options));
  host_.emplace(std::move(host));
  runtime::Pool& pool = host_->pool();
  pool_id_ = pool.header().creation_id;
  engine_id_ = RandomId();
  gpu_ = gpu::GpuAvailable();

  const runtime::BackendInfo& info = pool.backend().info();
  std::vector<runtime::BackendDevice> devs = info.devices;
  if (devs.empty()) devs.push_back({info.path, info.numa_node, 0, pool.size()});
  for (const runtime::BackendDevice& d : devs) {
    struct stat st;
    if (::stat(d.path.c_str(), &st) == 0) {
      backings_.push_back(
          {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino), d.offset, d.size});
    }
  }

  FreeStaleRegions();
  runtime::Membership& m = host_->membership();
  region_name_ = absl::StrCat(kRegionPrefix, m.slot(), ".", m.epoch(), ".",
                              absl::Hex(engine_id_, absl::kZeroPad16));
  CXLRT_ASSIGN_OR_RETURN(region_,
                         host_->allocator().AllocateNamed(region_name_, sizeof(RegionLayout)));
  // Everything but the magic, then the magic: a reader that sees the magic
  // sees the rest (docs/coherence.md: data before the flag).
  auto* r = new RegionLayout();
  std::memset(static_cast<void*>(r), 0, sizeof(RegionLayout));
  r->header.engine_id = engine_id_;
  r->header.epoch = m.epoch();
  r->header.slot = m.slot();
  r->header.name_len = static_cast<uint32_t>(agent.size());
  std::memcpy(r->header.name, agent.data(), agent.size());
  coh().Publish(region_, r, sizeof(RegionLayout));
  delete r;
  coh().StoreFlag(region_ + offsetof(RegionLayout, header.magic), kRegionMagic);
  service_ = std::thread([this] { ServiceLoop(); });
  return absl::OkStatus();
}

Engine::~Engine() {
  stop_.store(true);
  if (service_.joinable()) service_.join();
  if (region_ == 0) return;
  std::lock_guard<std::mutex> l(mu_);
  for (Xfer* x : active_) x->active = false;
  active_.clear();
  coh().StoreFlag(region_ + offsetof(RegionLayout, closed), 1);
  for (PoolOffset c : channels_) {
    absl::Status s = host_->allocator().Free(c);
    if (!s.ok()) {
      CXLRT_LOG(kWarning) << "CXLRT NIXL backend: freeing a channel: " << s;
    }
  }
  absl::Status s = host_->allocator().FreeNamed(region_name_);
  if (!s.ok()) {
    CXLRT_LOG(kWarning) << "CXLRT NIXL backend: freeing " << region_name_ << ": " << s;
  }
}

// Regions whose owner's incarnation is gone (it died without closing its
// engine): its slot is free or at another epoch now.
void Engine::FreeStaleRegions() {
  absl::StatusOr<std::vector<runtime::RegionInfo>> regions = host_->pool().ListRegions();
  if (!regions.ok()) return;
  for (const runtime::RegionInfo& r : *regions) {
    if (!absl::StartsWith(r.name, kRegionPrefix)) continue;
    std::vector<std::string> parts = absl::StrSplit(r.name.substr(sizeof(kRegionPrefix) - 1), '.');
    uint32_t slot = 0;
    uint64_t epoch = 0;
    if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &slot) ||
        !absl::SimpleAtoi(parts[1], &epoch)) {
      continue;
    }
    absl::StatusOr<runtime::HostView> v = host_->membership().Host(slot);
    if (!v.ok()) continue;
    if (v->liveness == runtime::Liveness::kFree || v->record.epoch != epoch) {
      absl::Status s = host_->allocator().FreeNamed(r.name);
      CXLRT_LOG(kInfo) << "CXLRT NIXL backend: freed stale region " << r.name << ": " << s;
    }
  }
}

PoolOffset Engine::PoolOffsetOf(uintptr_t addr, uint64_t len) const {
  const auto b = reinterpret_cast<uintptr_t>(base());
  const uint64_t size = host_->pool().size();
  if (addr >= b && addr - b <= size && len <= size - (addr - b)) return addr - b;
  // Another mapping of the pool in this process (the cxlrt Python package's
  // Host, say): a range of one of the pool's files.
  FILE* f = std::fopen("/proc/self/maps", "r");
  if (f == nullptr) return kNoOffset;
  PoolOffset found = kNoOffset;
  char line[4096];
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    uint64_t start = 0, end = 0, file_off = 0, ino = 0;
    unsigned major = 0, minor = 0;
    char perms[8] = {};
    if (std::sscanf(line, "%" SCNx64 "-%" SCNx64 " %7s %" SCNx64 " %x:%x %" SCNu64, &start, &end,
                    perms, &file_off, &major, &minor, &ino) != 7) {
      continue;
    }
    if (addr < start || addr >= end) continue;
    if (len > end - addr || perms[3] != 's') break;
    const uint64_t dev = makedev(major, minor);
    for (const Backing& bk : backings_) {
      const uint64_t in_file = file_off + (addr - start);
      if (bk.dev == dev && bk.ino == ino && in_file <= bk.size && len <= bk.size - in_file) {
        found = bk.pool_off + in_file;
      }
    }
    break;
  }
  std::fclose(f);
  return found;
}

absl::StatusOr<std::shared_ptr<Registration>> Engine::Register(uintptr_t addr, uint64_t len,
                                                               nixl_mem_t mem, uint64_t dev) {
  if (mem != DRAM_SEG && !(mem == VRAM_SEG && gpu_)) {
    return absl::UnimplementedError(absl::StrCat(
        "the CXLRT backend moves DRAM", gpu_ ? " and VRAM" : "", " (memory type ",
        static_cast<int>(mem), " asked for)",
        gpu_ ? "" : absl::StrCat("; VRAM needs a GPU: ", gpu::GpuUnavailableReason())));
  }
  if (addr == 0 && len != 0) return absl::InvalidArgumentError("registering a null address");
  auto reg = std::make_shared<Registration>();
  reg->key = RandomId();
  reg->addr = addr;
  reg->len = len;
  reg->mem = mem;
  reg->dev = dev;
  reg->pool_off = mem == DRAM_SEG ? PoolOffsetOf(addr, len) : kNoOffset;
  std::lock_guard<std::mutex> l(mu_);
  reg->id = next_reg_++;
  regs_[reg->id] = reg;
  if (reg->pool_off != kNoOffset) {
    CXLRT_LOG(kInfo) << "CXLRT NIXL backend: agent '" << agent_ << "' registered " << len
                     << " bytes in the pool at offset " << reg->pool_off << " (zero-copy)";
  } else {
    CXLRT_LOG(kInfo) << "CXLRT NIXL backend: agent '" << agent_ << "' registered " << len
                     << " bytes of private memory (staged through the pool)";
  }
  return reg;
}

void Engine::Deregister(uint64_t id) {
  std::lock_guard<std::mutex> l(mu_);
  regs_.erase(id);
}

std::string Engine::PublicData(const Registration& reg) const {
  RegWire w{};
  w.magic = kRegMagic;
  w.engine_id = engine_id_;
  w.id = reg.id;
  w.key = reg.key;
  w.addr = reg.addr;
  w.len = reg.len;
  w.pool_off = reg.pool_off;
  w.mem = reg.mem;
  return ToBytes(w);
}

std::string Engine::ConnInfo() const {
  ConnWire w{};
  w.magic = kConnMagic;
  w.pool_creation_id = pool_id_;
  w.pool_size = host_->pool().size();
  w.engine_id = engine_id_;
  w.epoch = host_->membership().epoch();
  w.region = region_;
  w.slot = host_->membership().slot();
  w.name_len = static_cast<uint32_t>(agent_.size());
  std::memcpy(w.name, agent_.data(), agent_.size());
  return ToBytes(w);
}

absl::Status Engine::LoadPeer(const std::string& agent, const std::string& info) {
  ConnWire w;
  if (!FromBytes(info, &w) || w.magic != kConnMagic || w.name_len > kMaxName) {
    return absl::InvalidArgumentError(absl::StrCat("connection info of NIXL agent '", agent,
                                                   "' is not a CXLRT backend's (", info.size(),
                                                   " bytes)"));
  }
  if (w.pool_creation_id != pool_id_ || w.pool_size != host_->pool().size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("NIXL agent '", agent, "' uses another pool (creation id ",
                     absl::Hex(w.pool_creation_id), ", ", w.pool_size, " bytes) than '", agent_,
                     "' (", host_->pool().name(), ", creation id ", absl::Hex(pool_id_),
                     "): the CXLRT backend moves "
                     "data only between agents of one pool"));
  }
  if (std::string(w.name, w.name_len) != agent) {
    return absl::InvalidArgumentError(absl::StrCat("connection info loaded for NIXL agent '", agent,
                                                   "' is agent '", std::string(w.name, w.name_len),
                                                   "''s"));
  }
  if (!InHeap(w.region, sizeof(RegionLayout))) {
    return absl::InvalidArgumentError(absl::StrCat("connection info of NIXL agent '", agent,
                                                   "' names a region outside the pool's heap"));
  }
  auto p = std::make_shared<Peer>();
  p->name = agent;
  p->engine_id = w.engine_id;
  p->slot = w.slot;
  p->epoch = w.epoch;
  p->region = w.region;
  p->local = w.engine_id == engine_id_;
  std::lock_guard<std::mutex> l(mu_);
  auto it = peers_.find(agent);
  if (it != peers_.end() && it->second->engine_id == w.engine_id) return absl::OkStatus();
  if (it != peers_.end()) FailPeer(*it->second, NIXL_ERR_REMOTE_DISCONNECT, "replaced");
  peers_[agent] = p;
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Peer>> Engine::FindPeer(const std::string& agent) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = peers_.find(agent);
  if (it == peers_.end()) {
    return absl::NotFoundError(absl::StrCat("NIXL agent '", agent_, "' has no connection info of '",
                                            agent, "' (load its metadata first)"));
  }
  return it->second;
}

absl::Status Engine::Connect(const std::string& agent) {
  if (agent == agent_) return absl::OkStatus();
  CXLRT_ASSIGN_OR_RETURN(std::shared_ptr<Peer> p, FindPeer(agent));
  std::lock_guard<std::mutex> l(mu_);
  if (p->out != 0) return absl::OkStatus();
  CXLRT_ASSIGN_OR_RETURN(p->out, MakeChannel(p->engine_id, p->name));
  return absl::OkStatus();
}

// The peer stays known (its channels and their counts live on, for when
// its metadata is loaded again); its transfers in progress fail.
void Engine::Disconnect(const std::string& agent) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = peers_.find(agent);
  if (it == peers_.end()) return;
  for (Xfer* x : active_) {
    if (x->peer == it->second && x->state == NIXL_IN_PROG) x->state = NIXL_ERR_REMOTE_DISCONNECT;
  }
}

absl::StatusOr<PoolOffset> Engine::MakeChannel(uint64_t peer_engine_id,
                                               const std::string& peer_name) {
  if (channels_.size() >= kMaxChannels) {
    return absl::ResourceExhaustedError(
        absl::StrCat("NIXL agent '", agent_, "' already has channels to ", kMaxChannels, " peers"));
  }
  allocator::AllocOptions o;
  o.alignment = 4096;
  CXLRT_ASSIGN_OR_RETURN(PoolOffset c, host_->allocator().Allocate(kChannelBytes, o));
  // Header, flags, results and ring zeroed and published; the bounce slots
  // are written before any request names them.
  std::vector<uint8_t> head(kChanOut, 0);
  ChannelHeaderLayout h{};
  h.magic = kChannelMagic;
  h.owner_engine_id = engine_id_;
  h.peer_engine_id = peer_engine_id;
  h.owner_name_len = static_cast<uint32_t>(agent_.size());
  h.peer_name_len = static_cast<uint32_t>(peer_name.size());
  std::memcpy(h.owner_name, agent_.data(), agent_.size());
  std::memcpy(h.peer_name, peer_name.data(), std::min<size_t>(peer_name.size(), kMaxName));
  std::memcpy(head.data(), &h, sizeof(h));
  coh().Publish(c, head.data(), head.size());
  const uint64_t n = channels_.size();
  coh().Publish(region_ + offsetof(RegionLayout, offsets) + 8 * n, &c, 8);
  coh().StoreFlag(region_ + offsetof(RegionLayout, count), n + 1);
  channels_.push_back(c);
  return c;
}

bool Engine::InHeap(PoolOffset off, uint64_t len) const {
  const uint64_t size = host_->pool().size();
  return off >= host_->pool().header().heap_offset && off <= size && len <= size - off;
}

bool Engine::ReadRegionHeader(PoolOffset region, RegionHeaderLayout* h) {
  if (!InHeap(region, sizeof(RegionLayout))) return false;
  if (coh().LoadFlag(region + offsetof(RegionLayout, header.magic)) != kRegionMagic) return false;
  coh().Fetch(h, region, sizeof(*h));
  if (h->name_len > kMaxName) return false;
  return coh().LoadFlag(region + offsetof(RegionLayout, closed)) == 0;
}

PoolOffset Engine::FindChannelToMe(PoolOffset region, uint64_t* seen) {
  if (!InHeap(region, sizeof(RegionLayout))) return 0;
  const uint64_t count =
      std::min<uint64_t>(coh().LoadFlag(region + offsetof(RegionLayout, count)), kMaxChannels);
  for (; *seen < count; ++*seen) {
    PoolOffset c = 0;
    coh().Fetch(&c, region + offsetof(RegionLayout, offsets) + 8 * *seen, 8);
    if (!InHeap(c, kChannelBytes)) continue;
    ChannelHeaderLayout h;
    coh().Fetch(&h, c, sizeof(h));
    if (h.magic == kChannelMagic && h.peer_engine_id == engine_id_) {
      ++*seen;
      return c;
    }
  }
  return 0;
}

// --- CxlrtEngine: NIXL's calls. ---

// The base class's members where the wheel's core reads them (its inline
// accessors are compiled into libnixl): checked here, where they are
// accessible.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winvalid-offsetof"
class EngineLayoutCheck : public nixlBackendEngine {
 public:
  static constexpr size_t InitErr() { return offsetof(EngineLayoutCheck, initErr); }
  static constexpr size_t LocalAgent() { return offsetof(EngineLayoutCheck, localAgent); }
  static constexpr size_t Telemetry() { return offsetof(EngineLayoutCheck, enableTelemetry_); }
};
static_assert(EngineLayoutCheck::InitErr() == 0xa0 && EngineLayoutCheck::LocalAgent() == 0xa8 &&
              EngineLayoutCheck::Telemetry() == 0xc8);
#pragma GCC diagnostic pop

CxlrtEngine::CxlrtEngine(const nixlBackendInitParams* params) : nixlBackendEngine(params) {
  std::string uri;
  const nixl_b_params_t& custom = getCustomParams();
  if (auto it = custom.find("pool"); it != custom.end()) uri = it->second;
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Open(localAgent, uri);
  if (!e.ok()) {
    CXLRT_LOG(kError) << "CXLRT NIXL backend for agent '" << localAgent
                      << "' cannot start: " << e.status();
    initErr = true;
    return;
  }
  engine_ = std::move(*e);
}

CxlrtEngine::~CxlrtEngine() = default;

nixl_mem_list_t CxlrtEngine::getSupportedMems() const {
  if (engine_ != nullptr && engine_->gpu()) return {DRAM_SEG, VRAM_SEG};
  return {DRAM_SEG};
}

nixl_status_t CxlrtEngine::registerMem(const nixlBlobDesc& mem, const nixl_mem_t& nixl_mem,
                                       nixlBackendMD*& out) {
  absl::StatusOr<std::shared_ptr<Registration>> r =
      engine_->Register(mem.addr, mem.len, nixl_mem, mem.devId);
  if (!r.ok()) {
    CXLRT_LOG(kError) << "CXLRT NIXL backend: registerMem: " << r.status();
    return ToNixl(r.status());
  }
  out = new LocalMD(*r);
  return NIXL_SUCCESS;
}

nixl_status_t CxlrtEngine::deregisterMem(nixlBackendMD* meta) {
  auto* md = dynamic_cast<LocalMD*>(meta);
  if (md == nullptr) return NIXL_ERR_INVALID_PARAM;
  engine_->Deregister(md->reg->id);
  delete md;
  return NIXL_SUCCESS;
}

nixl_status_t CxlrtEngine::connect(const std::string& remote_agent) {
  absl::Status s = engine_->Connect(remote_agent);
  if (!s.ok()) {
    CXLRT_LOG(kError) << "CXLRT NIXL backend: connect: " << s;
  }
  return ToNixl(s);
}

nixl_status_t CxlrtEngine::disconnect(const std::string& remote_agent) {
  engine_->Disconnect(remote_agent);
  return NIXL_SUCCESS;
}

nixl_status_t CxlrtEngine::unloadMD(nixlBackendMD* input) {
  auto* md = dynamic_cast<RemoteMD*>(input);
  if (md == nullptr) return NIXL_ERR_INVALID_PARAM;
  delete md;
  return NIXL_SUCCESS;
}

nixl_status_t CxlrtEngine::prepXfer(const nixl_xfer_op_t& operation, const nixl_meta_dlist_t& local,
                                    const nixl_meta_dlist_t& remote,
                                    const std::string& remote_agent, nixlBackendReqH*& handle,
                                    const nixl_opt_b_args_t*) const {
  absl::StatusOr<Xfer*> x = engine_->Prepare(operation, local, remote, remote_agent);
  if (!x.ok()) {
    CXLRT_LOG(kError) << "CXLRT NIXL backend: prepXfer: " << x.status();
    return ToNixl(x.status());
  }
  handle = *x;
  return NIXL_SUCCESS;
}

nixl_status_t CxlrtEngine::postXfer(const nixl_xfer_op_t& operation, const nixl_meta_dlist_t&,
                                    const nixl_meta_dlist_t&, const std::string&,
                                    nixlBackendReqH*& handle,
                                    const nixl_opt_b_args_t* opt_args) const {
  auto* x = dynamic_cast<Xfer*>(handle);
  if (x == nullptr || x->op != operation) return NIXL_ERR_INVALID_PARAM;
  return engine_->Post(x, opt_args);
}

nixl_status_t CxlrtEngine::checkXfer(nixlBackendReqH* handle) const {
  auto* x = dynamic_cast<Xfer*>(handle);
  if (x == nullptr) return NIXL_ERR_INVALID_PARAM;
  return engine_->Check(x);
}

nixl_status_t CxlrtEngine::releaseReqH(nixlBackendReqH* handle) const {
  auto* x = dynamic_cast<Xfer*>(handle);
  if (x == nullptr) return NIXL_ERR_INVALID_PARAM;
  engine_->Release(x);
  return NIXL_SUCCESS;
}

nixl_status_t CxlrtEngine::getPublicData(const nixlBackendMD* meta, std::string& str) const {
  const auto* md = dynamic_cast<const LocalMD*>(meta);
  if (md == nullptr) return NIXL_ERR_INVALID_PARAM;
  str = engine_->PublicData(*md->reg);
  return NIXL_SUCCESS;
}

nixl_status_t CxlrtEngine::getConnInfo(std::string& str) const {
  str = engine_->ConnInfo();
  return NIXL_SUCCESS;
}

nixl_status_t CxlrtEngine::loadRemoteConnInfo(const std::string& remote_agent,
                                              const std::string& remote_conn_info) {
  absl::Status s = engine_->LoadPeer(remote_agent, remote_conn_info);
  if (!s.ok()) {
    CXLRT_LOG(kError) << "CXLRT NIXL backend: " << s;
  }
  return ToNixl(s);
}

nixl_status_t CxlrtEngine::loadRemoteMD(const nixlBlobDesc& input, const nixl_mem_t& nixl_mem,
                                        const std::string& remote_agent, nixlBackendMD*& output) {
  absl::StatusOr<std::shared_ptr<Peer>> p = engine_->FindPeer(remote_agent);
  if (!p.ok()) {
    CXLRT_LOG(kError) << "CXLRT NIXL backend: loadRemoteMD: " << p.status();
    return ToNixl(p.status());
  }
  RegWire w;
  if (!FromBytes(input.metaInfo, &w) || w.magic != kRegMagic || w.engine_id != (*p)->engine_id ||
      w.mem != static_cast<uint32_t>(nixl_mem)) {
    CXLRT_LOG(kError) << "CXLRT NIXL backend: metadata of a buffer of agent '" << remote_agent
                      << "' is not a CXLRT registration of its current engine";
    return NIXL_ERR_INVALID_PARAM;
  }
  auto* md = new RemoteMD();
  md->peer = *p;
  md->reg.id = w.id;
  md->reg.key = w.key;
  md->reg.addr = w.addr;
  md->reg.len = w.len;
  md->reg.mem = nixl_mem;
  md->reg.pool_off = w.pool_off;
  output = md;
  return NIXL_SUCCESS;
}

nixl_status_t CxlrtEngine::loadLocalMD(nixlBackendMD* input, nixlBackendMD*& output) {
  auto* local = dynamic_cast<LocalMD*>(input);
  if (local == nullptr) return NIXL_ERR_INVALID_PARAM;
  auto* md = new RemoteMD();
  md->reg = *local->reg;
  output = md;
  return NIXL_SUCCESS;
}

nixl_status_t CxlrtEngine::getNotifs(notif_list_t& notif_list) {
  engine_->TakeNotifs(notif_list);
  return NIXL_SUCCESS;
}

nixl_status_t CxlrtEngine::genNotif(const std::string& remote_agent, const std::string& msg) const {
  absl::Status s = engine_->Notify(remote_agent, msg);
  if (!s.ok()) {
    CXLRT_LOG(kError) << "CXLRT NIXL backend: genNotif: " << s;
  }
  return ToNixl(s);
}

}  // namespace cxlrt::nixl
