// The CXLRT backend's data path: transfers, the requests they post to
// peers, serving peers' requests, notifications, liveness, progress.
// Everything here but the service loop runs under Engine::mu_.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "cxlrt/gpu/dma_engine.h"
#include "cxlrt/nixl/engine.h"
#include "cxlrt/runtime/log.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::nixl {
namespace {

// Bytes one progress step copies at most, so that no call holds the
// engine for long (about half a millisecond at memcpy's speed here).
constexpr uint64_t kProgressBudget = 8 << 20;
// How often the pool's directory is scanned for peers' new channels toward
// this engine, and a busy peer's host checked for life.
constexpr absl::Duration kDiscoverEvery = absl::Milliseconds(2);
constexpr absl::Duration kLivenessEvery = absl::Milliseconds(10);
// How long a VRAM copy may take before the transfer fails.
constexpr absl::Duration kDmaDeadline = absl::Seconds(30);

bool Inside(uintptr_t addr, uint64_t len, const Registration& r) {
  return addr >= r.addr && addr - r.addr <= r.len && len <= r.len - (addr - r.addr);
}

}  // namespace

// --- Copies. ---

absl::Status Engine::CopyIn(PoolOffset dst, const uint8_t* src, uint64_t n, nixl_mem_t mem) {
  if (mem != VRAM_SEG) {
    coh().CopyToPool(dst, src, n);
    return absl::OkStatus();
  }
  if (dma_ == nullptr) {
    CXLRT_ASSIGN_OR_RETURN(dma_, gpu::MakeDmaEngine(coh(), base(), host_->pool().size()));
  }
  return dma_->Wait(dma_->ToPool(dst, src, n), absl::Now() + kDmaDeadline);
}

absl::Status Engine::CopyOut(uint8_t* dst, PoolOffset src, uint64_t n, nixl_mem_t mem) {
  if (mem != VRAM_SEG) {
    coh().CopyFromPool(dst, src, n);
    return absl::OkStatus();
  }
  if (dma_ == nullptr) {
    CXLRT_ASSIGN_OR_RETURN(dma_, gpu::MakeDmaEngine(coh(), base(), host_->pool().size()));
  }
  coh().Invalidate(src, n);
  return dma_->Wait(dma_->FromPool(dst, base() + src, n), absl::Now() + kDmaDeadline);
}

// --- Preparing, posting, checking, releasing. ---

absl::StatusOr<Xfer*> Engine::Prepare(nixl_xfer_op_t op, const nixl_meta_dlist_t& local,
                                      const nixl_meta_dlist_t& remote,
                                      const std::string& remote_agent) {
  if (op != NIXL_READ && op != NIXL_WRITE) {
    return absl::InvalidArgumentError(absl::StrCat("transfer operation ", static_cast<int>(op)));
  }
  if (local.descCount() != remote.descCount()) {
    return absl::InvalidArgumentError(absl::StrCat("a transfer of ", local.descCount(),
                                                   " local and ", remote.descCount(),
                                                   " remote descriptors"));
  }
  const bool self = remote_agent == agent_;
  std::shared_ptr<Peer> peer;
  if (!self) {
    CXLRT_ASSIGN_OR_RETURN(peer, FindPeer(remote_agent));
  }
  auto x = std::make_unique<Xfer>();
  x->op = op;
  x->peer = peer;
  for (int i = 0; i < local.descCount(); ++i) {
    const nixlMetaDesc& l = local[i];
    const nixlMetaDesc& r = remote[i];
    auto* lm = dynamic_cast<LocalMD*>(l.metadataP);
    auto* rm = dynamic_cast<RemoteMD*>(r.metadataP);
    if (lm == nullptr || rm == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("descriptor ", i, " has no CXLRT registration on one side"));
    }
    if (l.len != r.len) {
      return absl::InvalidArgumentError(
          absl::StrCat("descriptor ", i, " moves ", l.len, " local bytes but ", r.len, " remote"));
    }
    if (self ? rm->peer != nullptr : rm->peer != peer) {
      return absl::InvalidArgumentError(absl::StrCat("descriptor ", i,
                                                     "'s remote buffer is not one of agent '",
                                                     remote_agent, "' as loaded now"));
    }
    if (!Inside(l.addr, l.len, *lm->reg) || !Inside(r.addr, r.len, rm->reg)) {
      return absl::InvalidArgumentError(
          absl::StrCat("descriptor ", i, " (", l.len, " bytes) lies outside its registration"));
    }
    if (l.len == 0) continue;
    Piece p;
    p.local = reinterpret_cast<uint8_t*>(l.addr);
    p.local_mem = lm->reg->mem;
    if (lm->reg->pool_off != kNoOffset) p.local_pool = lm->reg->pool_off + (l.addr - lm->reg->addr);
    p.len = l.len;
    p.remote_mem = rm->reg.mem;
    if (self) {
      if (p.local_mem != DRAM_SEG || p.remote_mem != DRAM_SEG) {
        return absl::UnimplementedError("transfers within one agent move DRAM only");
      }
      p.remote_local = reinterpret_cast<uint8_t*>(r.addr);
    } else if (rm->reg.pool_off != kNoOffset) {
      p.remote_pool = rm->reg.pool_off + (r.addr - rm->reg.addr);
      // The offset comes from the peer's metadata.
      if (!InHeap(p.remote_pool, p.len)) {
        return absl::InvalidArgumentError(
            absl::StrCat("descriptor ", i, " lies outside the pool's heap"));
      }
    } else {
      p.reg_id = rm->reg.id;
      p.key = rm->reg.key;
      p.raddr = r.addr;
    }
    // Contiguous on both sides and of the same kind: one piece.
    if (!x->pieces.empty()) {
      Piece& q = x->pieces.back();
      const bool local_next = q.local + q.len == p.local && q.local_mem == p.local_mem &&
                              (q.local_pool == kNoOffset) == (p.local_pool == kNoOffset) &&
                              (q.local_pool == kNoOffset || q.local_pool + q.len == p.local_pool);
      const bool remote_next =
          q.remote_mem == p.remote_mem &&
          ((self && q.remote_local + q.len == p.remote_local) ||
           (q.remote_pool != kNoOffset && p.remote_pool == q.remote_pool + q.len) ||
           (q.remote_pool == kNoOffset && !self && q.reg_id == p.reg_id &&
            q.raddr + q.len == p.raddr));
      if (local_next && remote_next) {
        q.len += p.len;
        continue;
      }
    }
    x->pieces.push_back(p);
  }
  return x.release();
}

nixl_status_t Engine::Post(Xfer* x, const nixl_opt_b_args_t* opt) {
  std::lock_guard<std::mutex> l(mu_);
  if (x->active || x->outstanding != 0) return NIXL_ERR_REPOST_ACTIVE;
  if (x->peer != nullptr && x->peer->failed != NIXL_SUCCESS) {
    CXLRT_LOG(kError) << "CXLRT NIXL backend: agent '" << x->peer->name << "': " << x->peer->why;
    return x->peer->failed;
  }
  x->has_notif = opt != nullptr && opt->hasNotif;
  x->notif = x->has_notif ? opt->notifMsg : std::string();
  if (x->notif.size() > kChunk) {
    CXLRT_LOG(kError) << "CXLRT NIXL backend: a notification of " << x->notif.size()
                      << " bytes (at most " << kChunk << ")";
    return NIXL_ERR_INVALID_PARAM;
  }
  if (x->peer != nullptr && x->peer->out == 0) {
    absl::StatusOr<PoolOffset> c = MakeChannel(x->peer->engine_id, x->peer->name);
    if (!c.ok()) {
      CXLRT_LOG(kError) << "CXLRT NIXL backend: " << c.status();
      return NIXL_ERR_BACKEND;
    }
    x->peer->out = *c;
  }
  x->next = 0;
  x->next_off = 0;
  x->notif_posted = false;
  x->state = NIXL_IN_PROG;
  x->active = true;
  active_.push_back(x);
  ProgressLocked();
  kicks_.fetch_add(1, std::memory_order_relaxed);
  return x->state;
}

nixl_status_t Engine::Check(Xfer* x) {
  bool waiting = false;
  nixl_status_t state;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (x->active) waiting = !ProgressLocked();
    state = x->state;
  }
  // Nothing moved: the transfer waits for the peer, whose engine may need
  // this core (a caller polls checkXfer in a loop). Not a wait: one yield.
  if (waiting && state == NIXL_IN_PROG) std::this_thread::yield();
  return state;
}

void Engine::Release(Xfer* x) {
  {
    std::lock_guard<std::mutex> l(mu_);
    active_.erase(std::remove(active_.begin(), active_.end(), x), active_.end());
    // Requests already posted run to their end at the peer; their answers
    // are reaped without touching the caller's memory any more.
    if (x->peer != nullptr) {
      for (Pending& pd : x->peer->pending) {
        if (pd.owner == x) {
          pd.owner = nullptr;
          pd.copy_out = nullptr;
        }
      }
    }
  }
  delete x;
}

// --- Notifications. ---

void Engine::TakeNotifs(notif_list_t& out) {
  {
    std::unique_lock<std::mutex> l(mu_, std::try_to_lock);
    if (l.owns_lock()) ProgressLocked();
  }
  std::lock_guard<std::mutex> l(notif_mu_);
  for (auto& n : notifs_) out.push_back(std::move(n));
  notifs_.clear();
}

absl::Status Engine::Notify(const std::string& agent, const std::string& msg) {
  if (msg.size() > kChunk) {
    return absl::InvalidArgumentError(
        absl::StrCat("a notification of ", msg.size(), " bytes (at most ", kChunk, ")"));
  }
  if (agent == agent_) {
    std::lock_guard<std::mutex> l(notif_mu_);
    notifs_.emplace_back(agent_, msg);
    return absl::OkStatus();
  }
  CXLRT_ASSIGN_OR_RETURN(std::shared_ptr<Peer> p, FindPeer(agent));
  std::lock_guard<std::mutex> l(mu_);
  if (p->failed != NIXL_SUCCESS) {
    return absl::AbortedError(absl::StrCat("NIXL agent '", agent, "': ", p->why));
  }
  if (p->out == 0) {
    CXLRT_ASSIGN_OR_RETURN(p->out, MakeChannel(p->engine_id, p->name));
  }
  // After what is queued already, so notifications keep their order.
  if (!p->queued_notifs.empty() || !PostNotifLocked(*p, msg)) p->queued_notifs.push_back(msg);
  kicks_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

bool Engine::PostNotifLocked(Peer& p, const std::string& msg) {
  if (p.posted - p.completed >= kRing) return false;
  RequestLayout req{};
  req.op = kOpNotif;
  req.msg_len = static_cast<uint32_t>(msg.size());
  int slot_kind = 0;
  if (msg.size() <= kInlineMsg) {
    std::memcpy(req.msg, msg.data(), msg.size());
  } else {
    if (p.out_slots - p.out_slots_done >= kSlots) return false;
    req.data_off = p.out + kChanOut + (p.out_slots % kSlots) * kChunk;
    coh().CopyToPool(req.data_off, msg.data(), msg.size());
    slot_kind = 1;
  }
  return PostRequest(p, req, nullptr, nullptr, slot_kind);
}

// --- Requests to a peer and their answers. ---

bool Engine::PostRequest(Peer& p, const RequestLayout& r, Xfer* owner, uint8_t* copy_out,
                         int slot_kind) {
  const uint64_t seq = p.posted;
  RequestLayout req = r;
  req.seq = seq + 1;
  // The entry, then the count that announces it.
  coh().Publish(p.out + kChanRing + (seq % kRing) * sizeof(RequestLayout), &req, sizeof(req));
  coh().StoreFlag(p.out + kChanPosted, seq + 1);
  p.posted = seq + 1;
  Pending pd;
  pd.seq = seq;
  pd.owner = owner;
  pd.copy_out = copy_out;
  pd.len = req.len;
  pd.data_off = req.data_off;
  pd.slot_kind = slot_kind;
  if (owner != nullptr) {
    ++owner->outstanding;
    pd.mem = owner->pieces[owner->next].local_mem;
  }
  if (slot_kind == 1) ++p.out_slots;
  if (slot_kind == 2) ++p.resp_slots;
  p.pending.push_back(pd);
  return true;
}

bool Engine::Reap(Peer& p) {
  if (p.local || p.failed != NIXL_SUCCESS || p.pending.empty()) return false;
  CheckLiveness(p, false);
  if (p.failed != NIXL_SUCCESS) return true;
  if (p.in == 0) {
    p.in = FindChannelToMe(p.region, &p.table_seen);
    if (p.in == 0) return false;
  }
  const uint64_t acked = coh().LoadFlag(p.in + kChanAcked);
  bool did = false;
  while (!p.pending.empty() && p.pending.front().seq < acked) {
    Pending pd = p.pending.front();
    p.pending.pop_front();
    ResultLayout r;
    coh().Fetch(&r, p.in + kChanResults + (pd.seq % kRing) * sizeof(ResultLayout), sizeof(r));
    auto st = r.seq == pd.seq + 1 ? static_cast<nixl_status_t>(r.status) : NIXL_ERR_BACKEND;
    if (pd.owner != nullptr) {
      if (st == NIXL_SUCCESS && pd.copy_out != nullptr) {
        absl::Status s = CopyOut(pd.copy_out, pd.data_off, pd.len, pd.mem);
        if (!s.ok()) {
          CXLRT_LOG(kError) << "CXLRT NIXL backend: " << s;
          st = NIXL_ERR_BACKEND;
        }
      }
      if (st != NIXL_SUCCESS && pd.owner->state == NIXL_IN_PROG) {
        CXLRT_LOG(kError) << "CXLRT NIXL backend: agent '" << p.name << "' refused request "
                          << pd.seq << ": status " << st;
        pd.owner->state = st;
      }
      --pd.owner->outstanding;
    }
    if (pd.slot_kind == 1) ++p.out_slots_done;
    if (pd.slot_kind == 2) ++p.resp_slots_done;
    ++p.completed;
    did = true;
  }
  return did;
}

// Issues what it can of `x` (copies to or from peers' pool ranges, requests
// for their private memory) and completes it when all is answered.
bool Engine::Advance(Xfer& x, uint64_t* budget) {
  Peer* peer = x.peer.get();
  if (peer != nullptr) {
    CheckLiveness(*peer, false);
    if (peer->failed != NIXL_SUCCESS) {
      x.state = peer->failed;
      return true;
    }
  }
  bool did = false;
  const bool write = x.op == NIXL_WRITE;
  while (x.next < x.pieces.size() && *budget > 0) {
    const Piece& p = x.pieces[x.next];
    const uint64_t off = x.next_off;
    uint64_t n = 0;
    if (p.remote_local != nullptr) {
      n = std::min(p.len - off, *budget);
      if (write) {
        std::memmove(p.remote_local + off, p.local + off, n);
      } else {
        std::memmove(p.local + off, p.remote_local + off, n);
      }
      *budget -= n;
    } else if (p.remote_pool != kNoOffset) {
      // Zero-copy: the peer's range is in the pool; this engine moves it.
      n = std::min(p.len - off, *budget);
      absl::Status s;
      if (p.local_pool != kNoOffset) {
        if (write) {
          coh().CopyToPool(p.remote_pool + off, coh().BeginRead(p.local_pool + off, n), n);
        } else {
          // Into our own range: for this process to read next, so through
          // the cache (Publish), not around it as for a peer (CopyToPool).
          coh().Publish(p.local_pool + off, coh().BeginRead(p.remote_pool + off, n), n);
        }
      } else if (write) {
        s = CopyIn(p.remote_pool + off, p.local + off, n, p.local_mem);
      } else {
        s = CopyOut(p.local + off, p.remote_pool + off, n, p.local_mem);
      }
      if (!s.ok()) {
        CXLRT_LOG(kError) << "CXLRT NIXL backend: " << s;
        x.state = NIXL_ERR_BACKEND;
        return true;
      }
      *budget -= n;
    } else {
      // The peer's private memory: a request it serves.
      n = std::min(p.len - off, kChunk);
      if (peer->posted - peer->completed >= kRing) break;
      RequestLayout req{};
      req.op = write ? kOpWrite : kOpRead;
      req.reg_id = p.reg_id;
      req.key = p.key;
      req.addr = p.raddr + off;
      req.len = n;
      int slot_kind = 0;
      uint8_t* copy_out = nullptr;
      if (p.local_pool != kNoOffset) {
        req.data_off = p.local_pool + off;  // the peer copies straight to or from our range
      } else if (write) {
        if (peer->out_slots - peer->out_slots_done >= kSlots) break;
        req.data_off = peer->out + kChanOut + (peer->out_slots % kSlots) * kChunk;
        absl::Status s = CopyIn(req.data_off, p.local + off, n, p.local_mem);
        if (!s.ok()) {
          CXLRT_LOG(kError) << "CXLRT NIXL backend: " << s;
          x.state = NIXL_ERR_BACKEND;
          return true;
        }
        *budget -= std::min(n, *budget);
        slot_kind = 1;
      } else {
        if (peer->in == 0) peer->in = FindChannelToMe(peer->region, &peer->table_seen);
        if (peer->in == 0) break;  // the peer has not answered this engine yet
        if (peer->resp_slots - peer->resp_slots_done >= kSlots) break;
        req.data_off = peer->in + kChanResp + (peer->resp_slots % kSlots) * kChunk;
        copy_out = p.local + off;
        slot_kind = 2;
      }
      PostRequest(*peer, req, &x, copy_out, slot_kind);
    }
    did = true;
    x.next_off += n;
    if (x.next_off == p.len) {
      ++x.next;
      x.next_off = 0;
    }
  }
  if (x.next == x.pieces.size() && x.state == NIXL_IN_PROG) {
    // The notification follows the data in the ring (or the copies above,
    // complete by now), so the peer sees it after the data.
    if (x.has_notif && !x.notif_posted) {
      if (peer == nullptr) {
        std::lock_guard<std::mutex> l(notif_mu_);
        notifs_.emplace_back(agent_, x.notif);
        x.notif_posted = true;
      } else if (peer->queued_notifs.empty() && PostNotifLocked(*peer, x.notif)) {
        x.notif_posted = true;
      }
      did = did || x.notif_posted;
    }
    if ((!x.has_notif || x.notif_posted) && x.outstanding == 0) {
      x.state = NIXL_SUCCESS;
      did = true;
    }
  }
  return did;
}

// --- Serving peers. ---

bool Engine::Serve(Incoming& in, uint64_t* budget) {
  Peer& sender = *in.peer;
  if (sender.failed != NIXL_SUCCESS || sender.out == 0) return false;
  const uint64_t posted = coh().LoadFlag(in.chan + kChanPosted);
  if (posted <= in.processed) return false;
  while ((in.processed < posted) && (*budget > 0)) {
    const uint64_t seq = in.processed;
    RequestLayout req;
    coh().Fetch(&req, in.chan + kChanRing + (seq % kRing) * sizeof(RequestLayout), sizeof(req));
    nixl_status_t st = NIXL_SUCCESS;
    const bool data_ok = InHeap(req.data_off, req.len);
    if (req.seq != seq + 1) {
      st = NIXL_ERR_BACKEND;
    } else if (req.op == kOpWrite || req.op == kOpRead) {
      auto it = regs_.find(req.reg_id);
      if (it == regs_.end() || it->second->key != req.key ||
          !Inside(req.addr, req.len, *it->second) || !data_ok) {
        st = NIXL_ERR_INVALID_PARAM;
      } else {
        auto* mine = reinterpret_cast<uint8_t*>(req.addr);
        absl::Status s = req.op == kOpWrite ? CopyOut(mine, req.data_off, req.len, it->second->mem)
                                            : CopyIn(req.data_off, mine, req.len, it->second->mem);
        if (!s.ok()) {
          CXLRT_LOG(kError) << "CXLRT NIXL backend: serving agent '" << sender.name << "': " << s;
          st = NIXL_ERR_BACKEND;
        }
        *budget -= std::min(*budget, req.len);
      }
    } else if (req.op == kOpNotif && req.msg_len <= kInlineMsg) {
      std::lock_guard<std::mutex> l(notif_mu_);
      notifs_.emplace_back(sender.name, std::string(req.msg, req.msg_len));
    } else if (req.op == kOpNotif && req.msg_len <= kChunk && InHeap(req.data_off, req.msg_len)) {
      std::string msg(req.msg_len, '\0');
      coh().CopyFromPool(msg.data(), req.data_off, req.msg_len);
      std::lock_guard<std::mutex> l(notif_mu_);
      notifs_.emplace_back(sender.name, std::move(msg));
    } else {
      st = NIXL_ERR_INVALID_PARAM;
    }
    if (st != NIXL_SUCCESS) {
      CXLRT_LOG(kWarning) << "CXLRT NIXL backend: agent '" << agent_ << "' refused request " << seq
                          << " of agent '" << sender.name << "' (status " << st << ")";
    }
    ResultLayout res{seq + 1, st};
    coh().Publish(sender.out + kChanResults + (seq % kRing) * sizeof(ResultLayout), &res,
                  sizeof(res));
    in.processed = seq + 1;
  }
  coh().StoreFlag(sender.out + kChanAcked, in.processed);
  return true;
}

// New channels toward this engine in other engines' regions.
bool Engine::Discover() {
  absl::StatusOr<std::vector<runtime::RegionInfo>> regions = host_->pool().ListRegions();
  if (!regions.ok()) return false;
  bool did = false;
  for (const runtime::RegionInfo& r : *regions) {
    if (r.offset == region_ || r.name.rfind(kRegionPrefix, 0) != 0) continue;
    RegionHeaderLayout h;
    if (!ReadRegionHeader(r.offset, &h)) continue;
    uint64_t& seen = seen_tables_[h.engine_id];  // by engine: a freed region's offset is reused
    const PoolOffset c = FindChannelToMe(r.offset, &seen);
    if (c == 0) continue;
    const std::string name(h.name, h.name_len);
    std::shared_ptr<Peer>& p = peers_[name];
    if (p == nullptr || p->engine_id != h.engine_id) {
      if (p != nullptr) FailPeer(*p, NIXL_ERR_REMOTE_DISCONNECT, "replaced by a new incarnation");
      p = std::make_shared<Peer>();
      p->name = name;
      p->engine_id = h.engine_id;
      p->slot = h.slot;
      p->epoch = h.epoch;
      p->region = r.offset;
    }
    p->in = c;
    if (p->out == 0) {
      absl::StatusOr<PoolOffset> out = MakeChannel(p->engine_id, p->name);
      if (!out.ok()) {
        CXLRT_LOG(kError) << "CXLRT NIXL backend: cannot answer agent '" << name
                          << "': " << out.status();
        continue;
      }
      p->out = *out;
    }
    auto in = std::make_unique<Incoming>();
    in->chan = c;
    in->peer = p;
    incoming_.push_back(std::move(in));
    did = true;
  }
  return did;
}

// --- Liveness. ---

void Engine::CheckLiveness(Peer& p, bool force) {
  if (p.local || p.failed != NIXL_SUCCESS) return;
  const absl::Time now = absl::Now();
  if (!force && now < p.next_liveness) return;
  p.next_liveness = now + kLivenessEvery;
  absl::StatusOr<runtime::HostView> v = host_->membership().Host(p.slot);
  if (!v.ok()) {
    FailPeer(p, NIXL_ERR_REMOTE_DISCONNECT, v.status().ToString());
  } else if (v->record.epoch != p.epoch || (v->liveness != runtime::Liveness::kAlive &&
                                            v->liveness != runtime::Liveness::kSelf)) {
    FailPeer(p, NIXL_ERR_REMOTE_DISCONNECT,
             absl::StrCat("its host (slot ", p.slot, ", epoch ", p.epoch, ") is ",
                          runtime::LivenessName(v->liveness), " at epoch ", v->record.epoch));
  } else if (coh().LoadFlag(p.region + offsetof(RegionLayout, closed)) != 0 ||
             coh().LoadFlag(p.region + offsetof(RegionLayout, header.magic)) != kRegionMagic) {
    FailPeer(p, NIXL_ERR_REMOTE_DISCONNECT, "it closed its CXLRT backend");
  }
}

void Engine::FailPeer(Peer& p, nixl_status_t why, const std::string& message) {
  if (p.failed != NIXL_SUCCESS) return;
  p.failed = why;
  p.why = message;
  CXLRT_LOG(kError) << "CXLRT NIXL backend: agent '" << agent_ << "' lost agent '" << p.name
                    << "': " << message;
  for (Pending& pd : p.pending) {
    if (pd.owner != nullptr) {
      if (pd.owner->state == NIXL_IN_PROG) pd.owner->state = why;
      pd.owner->outstanding = 0;
    }
  }
  p.pending.clear();
  p.queued_notifs.clear();
  for (Xfer* x : active_) {
    if (x->peer.get() == &p && x->state == NIXL_IN_PROG) x->state = why;
  }
}

// --- Progress. ---

bool Engine::ProgressLocked() {
  bool did = false;
  uint64_t budget = kProgressBudget;
  const absl::Time now = absl::Now();
  if (now >= next_discover_) {
    did = Discover() || did;
    next_discover_ = now + kDiscoverEvery;
  }
  for (auto& in : incoming_) did = Serve(*in, &budget) || did;
  for (auto& [name, p] : peers_) {
    did = Reap(*p) || did;
    while (!p->queued_notifs.empty() && p->failed == NIXL_SUCCESS && p->out != 0 &&
           PostNotifLocked(*p, p->queued_notifs.front())) {
      p->queued_notifs.pop_front();
      did = true;
    }
  }
  for (size_t i = 0; i < active_.size();) {
    Xfer* x = active_[i];
    if (x->state == NIXL_IN_PROG) did = Advance(*x, &budget) || did;
    if (x->state != NIXL_IN_PROG) {
      x->active = false;
      active_.erase(active_.begin() + i);
    } else {
      ++i;
    }
  }
  return did;
}

// Answers peers and advances transfers while the caller does not call in:
// busy, it runs step after step; for kHotFor after the last work it only
// yields between steps (a peer's next request usually follows at once);
// idle longer, it sleeps, longer and longer, up to kMaxSleepUs.
void Engine::ServiceLoop() {
  constexpr auto kHotFor = std::chrono::milliseconds(20);
  constexpr int kMaxSleepUs = 500;
  auto last_work = std::chrono::steady_clock::now();
  int sleep_us = 8;
  uint64_t kicks = 0;
  while (!stop_.load(std::memory_order_relaxed)) {
    bool did = false;
    {
      std::unique_lock<std::mutex> l(mu_, std::try_to_lock);
      if (l.owns_lock()) did = ProgressLocked();
    }
    const uint64_t k = kicks_.load(std::memory_order_relaxed);
    const auto now = std::chrono::steady_clock::now();
    if (did || k != kicks) {
      kicks = k;
      last_work = now;
      sleep_us = 8;
      continue;
    }
    if (now - last_work < kHotFor) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
      sleep_us = std::min(kMaxSleepUs, sleep_us * 2);
    }
  }
}

}  // namespace cxlrt::nixl
