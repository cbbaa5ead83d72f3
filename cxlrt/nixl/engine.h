// The CXLRT backend engine of NIXL: moves the data of NIXL transfers
// between agents through a cxlrt pool (docs/nixl.md).
//
// Each engine opens the pool (backend parameter `pool`, else CXLRT_POOL),
// attaches as a host of it and owns a region and per-peer channels there
// (channel_layout.h). What moves how, per descriptor:
// - the peer's range lies in the pool: this engine reads or writes it where
//   it is (zero-copy, one copy in all);
// - the peer's range is its private memory and ours lies in the pool: a
//   request asks the peer to copy between its memory and our range;
// - both private: staged through bounce slots in the pool, the two copies
//   of consecutive chunks overlapping (ours of one, the peer's of another).
// Progress: the caller's postXfer / checkXfer / getNotifs calls and a
// service thread of the engine (which also answers peers' requests) both
// advance the work; none of them waits for a peer.
//
// Thread-safety: NIXL calls an engine from any thread; every method locks
// what it touches. One mutex (mu_) guards the transfer and channel state;
// work done under it is bounded per call (kProgressBudget bytes).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cxlrt/cxlrt.h"
#include "cxlrt/nixl/channel_layout.h"
#include "cxlrt/nixl/nixl_abi.h"

namespace cxlrt::gpu {
class DmaEngine;
}

namespace cxlrt::nixl {

inline constexpr PoolOffset kNoOffset = ~PoolOffset{0};

// A registered range of this engine.
struct Registration {
  uint64_t id = 0;
  uint64_t key = 0;  // random; a peer's request must quote it
  uintptr_t addr = 0;
  uint64_t len = 0;
  nixl_mem_t mem = DRAM_SEG;
  uint64_t dev = 0;
  PoolOffset pool_off = kNoOffset;  // where it lies in the pool, kNoOffset: private memory
};

class Engine;
struct Peer;
struct Xfer;

class CxlrtEngine : public nixlBackendEngine {
 public:
  explicit CxlrtEngine(const nixlBackendInitParams* params);
  ~CxlrtEngine() override;

  bool supportsRemote() const override { return true; }
  bool supportsLocal() const override { return true; }
  bool supportsNotif() const override { return true; }
  nixl_mem_list_t getSupportedMems() const override;

  nixl_status_t registerMem(const nixlBlobDesc& mem, const nixl_mem_t& nixl_mem,
                            nixlBackendMD*& out) override;
  nixl_status_t deregisterMem(nixlBackendMD* meta) override;
  nixl_status_t connect(const std::string& remote_agent) override;
  nixl_status_t disconnect(const std::string& remote_agent) override;
  nixl_status_t unloadMD(nixlBackendMD* input) override;
  nixl_status_t prepXfer(const nixl_xfer_op_t& operation, const nixl_meta_dlist_t& local,
                         const nixl_meta_dlist_t& remote, const std::string& remote_agent,
                         nixlBackendReqH*& handle,
                         const nixl_opt_b_args_t* opt_args = nullptr) const override;
  nixl_status_t postXfer(const nixl_xfer_op_t& operation, const nixl_meta_dlist_t& local,
                         const nixl_meta_dlist_t& remote, const std::string& remote_agent,
                         nixlBackendReqH*& handle,
                         const nixl_opt_b_args_t* opt_args = nullptr) const override;
  nixl_status_t checkXfer(nixlBackendReqH* handle) const override;
  nixl_status_t releaseReqH(nixlBackendReqH* handle) const override;
  nixl_status_t getPublicData(const nixlBackendMD* meta, std::string& str) const override;
  nixl_status_t getConnInfo(std::string& str) const override;
  nixl_status_t loadRemoteConnInfo(const std::string& remote_agent,
                                   const std::string& remote_conn_info) override;
  nixl_status_t loadRemoteMD(const nixlBlobDesc& input, const nixl_mem_t& nixl_mem,
                             const std::string& remote_agent, nixlBackendMD*& output) override;
  nixl_status_t loadLocalMD(nixlBackendMD* input, nixlBackendMD*& output) override;
  nixl_status_t getNotifs(notif_list_t& notif_list) override;
  nixl_status_t genNotif(const std::string& remote_agent, const std::string& msg) const override;

 private:
  std::unique_ptr<Engine> engine_;  // null when the constructor failed (initErr)
};

// The engine's state, apart from NIXL's base class (engine.cc, transfer.cc).
class Engine {
 public:
  // Opens the pool `uri` ("": CXLRT_POOL), attaches and publishes the region.
  static absl::StatusOr<std::unique_ptr<Engine>> Open(const std::string& agent,
                                                      const std::string& uri);
  ~Engine();

  // Registration (engine.cc).
  absl::StatusOr<std::shared_ptr<Registration>> Register(uintptr_t addr, uint64_t len,
                                                         nixl_mem_t mem, uint64_t dev);
  void Deregister(uint64_t id);
  std::string PublicData(const Registration& reg) const;
  std::string ConnInfo() const;
  // The peer `agent` as `info` describes it (replacing an older incarnation).
  absl::Status LoadPeer(const std::string& agent, const std::string& info);
  absl::StatusOr<std::shared_ptr<Peer>> FindPeer(const std::string& agent);
  absl::Status Connect(const std::string& agent);
  void Disconnect(const std::string& agent);
  const std::string& agent() const { return agent_; }
  bool gpu() const { return gpu_; }

  // Transfers (transfer.cc).
  absl::StatusOr<Xfer*> Prepare(nixl_xfer_op_t op, const nixl_meta_dlist_t& local,
                                const nixl_meta_dlist_t& remote, const std::string& remote_agent);
  nixl_status_t Post(Xfer* x, const nixl_opt_b_args_t* opt);
  nixl_status_t Check(Xfer* x);
  void Release(Xfer* x);
  void TakeNotifs(notif_list_t& out);
  absl::Status Notify(const std::string& agent, const std::string& msg);

 private:
  // A peer's channel toward this engine: its requests.
  struct Incoming {
    PoolOffset chan = 0;         // the sender's channel toward this engine
    std::shared_ptr<Peer> peer;  // the sender; its `out` carries the answers
    uint64_t processed = 0;
  };
  Engine() = default;

  // engine.cc
  absl::Status Start(const std::string& agent, const std::string& uri);
  PoolOffset PoolOffsetOf(uintptr_t addr, uint64_t len) const;
  absl::StatusOr<PoolOffset> MakeChannel(uint64_t peer_engine_id, const std::string& peer_name);
  void FreeStaleRegions();
  // [off, off + len) lies in the pool's heap: the only part a peer's
  // offset (its metadata, a request in its ring) may name, never the pool's
  // header, host table or directory.
  bool InHeap(PoolOffset off, uint64_t len) const;
  // Reads the region of the engine at `region`: its header (false when not
  // yet published or closed).
  bool ReadRegionHeader(PoolOffset region, RegionHeaderLayout* h);
  // Finds the channel of the engine at `region` toward this engine (0: none
  // yet), from table index `*seen` on.
  PoolOffset FindChannelToMe(PoolOffset region, uint64_t* seen);

  // transfer.cc, all under mu_.
  bool ProgressLocked();
  bool Discover();
  bool Serve(Incoming& in, uint64_t* budget);
  bool Reap(Peer& p);
  bool Advance(Xfer& x, uint64_t* budget);
  bool PostRequest(Peer& p, const RequestLayout& req, Xfer* owner, uint8_t* copy_out,
                   int slot_kind);
  bool PostNotifLocked(Peer& p, const std::string& msg);
  void CheckLiveness(Peer& p, bool force);
  void FailPeer(Peer& p, nixl_status_t why, const std::string& message);
  // Copies between this process's memory (DRAM, or VRAM through the gpu/
  // layer's DMA engine) and the pool. Not OK only for VRAM (a DMA failure).
  absl::Status CopyIn(PoolOffset dst, const uint8_t* src, uint64_t n, nixl_mem_t mem);
  absl::Status CopyOut(uint8_t* dst, PoolOffset src, uint64_t n, nixl_mem_t mem);
  void ServiceLoop();
  runtime::Coherence& coh() const { return host_->pool().coherence(); }
  uint8_t* base() const { return host_->pool().backend().base(); }

  std::string agent_;
  std::optional<Host> host_;  // set by Start
  bool gpu_ = false;
  std::unique_ptr<gpu::DmaEngine> dma_;
  uint64_t engine_id_ = 0;
  std::string region_name_;
  PoolOffset region_ = 0;
  uint64_t pool_id_ = 0;
  // The backing files of the pool (device, inode, offset in the pool): a
  // range mapped from one of them elsewhere in this process lies in the pool.
  struct Backing {
    uint64_t dev, ino, pool_off, size;
  };
  std::vector<Backing> backings_;

  mutable std::mutex mu_;
  std::map<uint64_t, std::shared_ptr<Registration>> regs_;
  uint64_t next_reg_ = 1;
  std::map<std::string, std::shared_ptr<Peer>> peers_;
  std::vector<PoolOffset> channels_;  // mine, in table order
  std::vector<std::unique_ptr<Incoming>> incoming_;
  std::vector<Xfer*> active_;
  absl::Time next_discover_ = absl::InfinitePast();
  std::map<uint64_t, uint64_t> seen_tables_;  // other engines (by id): table entries read

  std::mutex notif_mu_;
  notif_list_t notifs_;

  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> kicks_{0};
  std::thread service_;
};

// A piece of a transfer: one descriptor's range, or part of it.
struct Piece {
  uint8_t* local = nullptr;  // this process's address
  PoolOffset local_pool = kNoOffset;
  nixl_mem_t local_mem = DRAM_SEG;
  uint64_t len = 0;
  // The remote side: in the pool (remote_pool), or the peer's registration.
  PoolOffset remote_pool = kNoOffset;
  uint8_t* remote_local = nullptr;  // a transfer within this agent
  nixl_mem_t remote_mem = DRAM_SEG;
  uint64_t reg_id = 0, key = 0, raddr = 0;
};

struct Xfer : public nixlBackendReqH {
  nixl_xfer_op_t op = NIXL_WRITE;
  std::shared_ptr<Peer> peer;  // null: within this agent
  std::vector<Piece> pieces;
  size_t next = 0;        // piece being issued
  uint64_t next_off = 0;  // bytes of it issued
  uint64_t outstanding = 0;
  bool has_notif = false;
  bool notif_posted = false;
  std::string notif;
  bool active = false;
  nixl_status_t state = NIXL_ERR_NOT_POSTED;
};

// A request this engine posted and the peer has not yet answered.
struct Pending {
  uint64_t seq = 0;
  Xfer* owner = nullptr;        // null: a notification, or a released transfer
  uint8_t* copy_out = nullptr;  // a staged read: where the data goes
  nixl_mem_t mem = DRAM_SEG;
  uint64_t len = 0;
  PoolOffset data_off = 0;
  int slot_kind = 0;  // 0: none, 1: an out slot, 2: a resp slot of the peer
};

// Another engine of the pool this one talks to.
struct Peer {
  std::string name;
  uint64_t engine_id = 0;
  uint32_t slot = 0;
  uint64_t epoch = 0;
  PoolOffset region = 0;
  PoolOffset out = 0;  // this engine's channel toward the peer (0: not made yet)
  PoolOffset in = 0;   // the peer's channel toward this engine (0: not seen yet)
  uint64_t table_seen = 0;
  uint64_t posted = 0;                           // requests posted on `out`
  uint64_t completed = 0;                        // of those, answered and reaped
  uint64_t out_slots = 0, out_slots_done = 0;    // staged writes' slots taken / freed
  uint64_t resp_slots = 0, resp_slots_done = 0;  // staged reads' slots of the peer
  std::deque<Pending> pending;
  std::deque<std::string> queued_notifs;  // genNotif while the ring was full
  nixl_status_t failed = NIXL_SUCCESS;    // not SUCCESS: dead, gone or refused
  std::string why;
  absl::Time next_liveness = absl::InfinitePast();
  bool local = false;  // this engine itself
};

}  // namespace cxlrt::nixl

namespace cxlrt::nixl {

// registerMem's answer: the registration (shared with the engine's table).
class LocalMD : public nixlBackendMD {
 public:
  explicit LocalMD(std::shared_ptr<Registration> r) : nixlBackendMD(true), reg(std::move(r)) {}
  std::shared_ptr<Registration> reg;
};

// loadRemoteMD's (and loadLocalMD's) answer: a peer's registration as its
// public data described it.
class RemoteMD : public nixlBackendMD {
 public:
  RemoteMD() : nixlBackendMD(false) {}
  std::shared_ptr<Peer> peer;  // null: this engine's own (loadLocalMD)
  Registration reg;
};

}  // namespace cxlrt::nixl
