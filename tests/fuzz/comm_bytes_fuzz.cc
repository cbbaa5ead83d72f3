// libFuzzer harness for what a rank parses of its peers' communicator
// lines: rank 0's header (read by a joiner), a peer's join line, its posts
// (every collective reads them) and its point-to-point channel.
//
// Two hosts of one pool live in this process. For each input one is the
// victim, a real Communicator; the other is a hostile peer that writes the
// lines by hand: first as a correct peer would, then with the input's
// patches over the one record the input names (re-sealed when it has a
// checksum and the input asks). Input:
//   u8 target: 0 header, 1 join line, 2 post, 3 p2p line
//   u8 call (target 2): 0 AllReduce, 1 Broadcast, 2 AllGather,
//      3 ReduceScatter, 4 Barrier; bit 7: out-of-line (large) data
//   u8 flags: bit 0: re-seal the header's checksum
//   repeated { u8 offset in the record; u8 length; bytes }
// The victim must return OK or an error within its deadline: a crash, an
// abort, a hang or a sanitizer report is a finding. Run by ctest for a
// bounded time with the seeds of tests/fuzz/corpus/comm_bytes.
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cxlrt/allocator/allocator.h"
#include "cxlrt/collectives/comm_layout.h"
#include "cxlrt/collectives/communicator.h"
#include "cxlrt/runtime/checksum.h"
#include "cxlrt/runtime/membership.h"
#include "cxlrt/runtime/pool.h"

namespace {

using namespace cxlrt;               // NOLINT: a harness
using namespace cxlrt::collectives;  // NOLINT

constexpr int kCalls = 5;
constexpr size_t kSmallCount = 8;    // floats: inline posts
constexpr size_t kLargeCount = 256;  // floats: out-of-line posts
constexpr absl::Duration kTimeout = absl::Milliseconds(40);
constexpr char kName[] = "fz";
constexpr char kBlockName[] = "comm/fz";

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "comm_bytes_fuzz setup: %s\n", what.c_str());
  std::abort();
}

struct Host {
  std::unique_ptr<runtime::Pool> pool;
  std::unique_ptr<runtime::Membership> membership;
  std::unique_ptr<allocator::Allocator> alloc;
  runtime::Coherence& c() { return pool->coherence(); }
};

struct World {
  std::string uri;
  std::string path;
  Host victim, hostile;
};

Host OpenHost(const std::string& uri) {
  Host h;
  auto pool = runtime::Pool::Open(uri);
  if (!pool.ok()) Die(pool.status().ToString());
  h.pool = std::move(*pool);
  runtime::AttachOptions ao;
  ao.host_id = -1;
  auto m = runtime::Membership::Attach(*h.pool, ao);
  if (!m.ok()) Die(m.status().ToString());
  h.membership = std::move(*m);
  auto a = allocator::Allocator::Open(*h.pool, *h.membership);
  if (!a.ok()) Die(a.status().ToString());
  h.alloc = std::move(*a);
  return h;
}

World& TheWorld() {
  static World* w = [] {
    auto* w = new World;
    const std::string name = absl::StrCat("commfuzz", getpid());
    w->uri = absl::StrCat("emu://", name, "?dir=/dev/shm");
    w->path = absl::StrCat("/dev/shm/cxlrt-", name, ".pool");
    auto made = runtime::Pool::Create(absl::StrCat(w->uri, "&size=64M&hosts=4"));
    if (!made.ok()) Die(made.status().ToString());
    made->reset();
    w->victim = OpenHost(w->uri);
    w->hostile = OpenHost(w->uri);
    return w;
  }();
  return *w;
}

struct Input {
  int target = 0;
  int call = 0;
  bool large = false;
  bool reseal = false;
  const uint8_t* patches = nullptr;
  size_t patches_size = 0;
  absl::Duration timeout = kTimeout;  // of every wait of the victim
};

// Applies the input's patches to the record `obj` of `size` bytes.
void Patch(const Input& in, void* obj, size_t size) {
  auto* p = static_cast<uint8_t*>(obj);
  for (size_t i = 0; i + 2 <= in.patches_size;) {
    const size_t off = in.patches[i] % size;
    const size_t len = in.patches[i + 1];
    i += 2;
    const size_t n = std::min(len, in.patches_size - i);
    std::memcpy(p + off, in.patches + i, std::min(n, size - off));
    i += n;
  }
}

CommOptions Options(const Input& in) {
  CommOptions o;
  o.timeout = in.timeout;
  o.slot_bytes = 4096;
  o.p2p_bytes = 4096;  // chunks of 1 KiB: one holds the large Send
  return o;
}

// Waits for the victim-or-real rank 0's header; nullopt after the timeout.
std::optional<std::pair<runtime::PoolOffset, CommHeaderLayout>> AwaitHeader(Host& h) {
  const absl::Time end = absl::Now() + 4 * kTimeout;
  while (absl::Now() < end) {
    auto b = h.alloc->Find(kBlockName);
    if (b.ok() && b->size >= sizeof(CommHeaderLayout)) {
      auto hdr = h.c().FetchObject<CommHeaderLayout>(b->offset);
      if (hdr.magic == kCommMagic) return std::make_pair(b->offset, hdr);
    }
    absl::SleepFor(absl::Microseconds(200));
  }
  return std::nullopt;
}

// Target 0: a real rank 0 on the hostile host; its header is damaged before
// the victim joins as rank 1. Returns the victim's join.
absl::Status FuzzHeader(World& w, const Input& in) {
  absl::Status victim = absl::DeadlineExceededError("rank 0 made no header");
  std::atomic<bool> victim_done{false};
  std::thread maker([&] {
    auto comm = Communicator::Create(*w.hostile.alloc, kName, 2, 0, Options(in));
    while (!victim_done.load()) absl::SleepFor(absl::Microseconds(100));
    if (comm.ok()) (void)(*comm)->Destroy();
  });
  if (auto made = AwaitHeader(w.hostile)) {
    auto& [at, hdr] = *made;
    Patch(in, &hdr, sizeof(hdr));
    if (in.reseal) hdr.checksum = runtime::Crc32c(&hdr, offsetof(CommHeaderLayout, checksum));
    w.hostile.c().PublishObject(at, hdr);
    auto comm = Communicator::Create(*w.victim.alloc, kName, 2, 1, Options(in));
    victim = comm.status();
    if (comm.ok()) (*comm)->Abort("fuzz");
  }
  victim_done = true;
  maker.join();
  return victim;
}

// The victim's call, and the post a correct rank 1 would publish for it.
absl::Status RunCall(Communicator& comm, const Input& in, size_t count) {
  std::vector<float> send(count * 2, 1.0f), recv(count * 2, 0.0f);
  switch (in.call) {
    case 0:
      return comm.AllReduce(send.data(), recv.data(), count, DataType::kFloat32, RedOp::kSum);
    case 1:
      return comm.Broadcast(nullptr, recv.data(), count, DataType::kFloat32, 1);
    case 2:
      return comm.AllGather(send.data(), recv.data(), count, DataType::kFloat32);
    case 3:
      return comm.ReduceScatter(send.data(), recv.data(), count, DataType::kFloat32, RedOp::kSum);
    default:
      return comm.Barrier();
  }
}

PostLayout CorrectPost(const Input& in, uint64_t instance, size_t count, runtime::PoolOffset slot) {
  PostLayout p = {};
  p.seq = 1;
  p.instance = instance;
  p.desc.call = 1;
  p.desc.type = static_cast<uint8_t>(DataType::kFloat32);
  p.desc.op = static_cast<uint8_t>(RedOp::kSum);
  p.desc.count = count;
  size_t len = count * 4;
  switch (in.call) {
    case 0:
      p.desc.kind = static_cast<uint8_t>(CollKind::kAllReduce);
      break;
    case 1:
      p.desc.kind = static_cast<uint8_t>(CollKind::kBroadcast);
      p.desc.root = 1;
      break;
    case 2:
      p.desc.kind = static_cast<uint8_t>(CollKind::kAllGather);
      break;
    case 3:
      p.desc.kind = static_cast<uint8_t>(CollKind::kReduceScatter);
      len = 2 * count * 4;
      break;
    default:
      p.desc.kind = static_cast<uint8_t>(CollKind::kBarrier);  // as Barrier() begins it
      p.desc.count = 0;
      p.desc.type = static_cast<uint8_t>(DataType::kUint8);
      len = 0;
      break;
  }
  p.len = len;
  if (len > kInlineBytes) p.data = slot;
  return p;
}

// Targets 1-3: the victim is rank 0; the hostile rank 1 joins and posts by
// hand, damaging its join line, its post or its p2p channel. Returns the
// victim's join or call.
absl::Status FuzzPeer(World& w, const Input& in) {
  const size_t count = in.large ? kLargeCount : kSmallCount;
  std::atomic<bool> victim_done{false};
  std::thread peer([&] {
    Host& h = w.hostile;
    auto made = AwaitHeader(h);
    if (!made) return;
    auto& [block, hdr] = *made;
    auto slot = h.alloc->Allocate(hdr.slot_bytes);
    if (!slot.ok()) Die(slot.status().ToString());
    std::vector<float> ones(hdr.slot_bytes / 4, 1.0f);
    h.c().CopyToPool(*slot, ones.data(), hdr.slot_bytes);
    const runtime::PoolOffset rank1 = block + sizeof(CommHeaderLayout) + sizeof(RankLayout);
    JoinLayout me = {};
    me.state = static_cast<uint64_t>(JoinState::kJoined);
    me.instance = hdr.instance;
    me.host_slot = h.membership->slot();
    me.host_epoch = h.membership->epoch();
    me.pid = getpid();
    RingLayout ring = {};
    for (uint32_t i = 0; i < kMaxDepth; ++i) ring.slot[i] = *slot;
    if (in.target == 1) {
      // The join line and the ring line, as one record.
      struct {
        JoinLayout join;
        RingLayout ring;
      } lines = {me, ring};
      Patch(in, &lines, sizeof(lines));
      me = lines.join;
      ring = lines.ring;
    }
    h.c().Publish(rank1 + 8, reinterpret_cast<uint8_t*>(&me) + 8, sizeof(me) - 8);
    h.c().Publish(rank1 + offsetof(RankLayout, ring), &ring, sizeof(ring));
    h.c().StoreFlag(rank1, me.state);
    if (in.target == 3) {
      // The first chunk of a Send of `count` floats to rank 0: the whole
      // message.
      P2pChunkLayout p = {};
      p.posted = 1;
      p.bytes = count * 4;
      p.total = count;
      p.type = static_cast<uint64_t>(DataType::kFloat32);
      p.instance = hdr.instance;
      Patch(in, &p, sizeof(p));
      const runtime::PoolOffset line =
          block + hdr.p2p_offset + 2 * sizeof(P2pLayout) + offsetof(P2pLayout, chunk);  // [1][0]
      h.c().Publish(line + 8, reinterpret_cast<uint8_t*>(&p) + 8, sizeof(p) - 8);
      h.c().StoreFlag(line, p.posted);
    } else {
      PostLayout post = CorrectPost(in, hdr.instance, count, *slot);
      if (in.target == 2) Patch(in, &post, sizeof(post));
      const runtime::PoolOffset line =
          rank1 + offsetof(RankLayout, post) + (post.seq % hdr.depth) * sizeof(PostLayout);
      h.c().Publish(line + 8, reinterpret_cast<uint8_t*>(&post) + 8, sizeof(post) - 8);
      h.c().StoreFlag(line, post.seq);
    }
    while (!victim_done.load()) absl::SleepFor(absl::Microseconds(100));
    h.c().StoreFlag(rank1, static_cast<uint64_t>(JoinState::kLeft));
    (void)h.alloc->Free(*slot);
  });
  auto comm = Communicator::Create(*w.victim.alloc, kName, 2, 0, Options(in));
  absl::Status victim = comm.status();
  if (comm.ok()) {
    if (in.target == 3) {
      std::vector<float> out(count);
      victim = (*comm)->Recv(out.data(), count, DataType::kFloat32, 1);
    } else {
      victim = RunCall(**comm, in, count);
    }
  }
  victim_done = true;
  peer.join();
  if (comm.ok()) (void)(*comm)->Destroy();
  return victim;
}

absl::Status Fuzz(World& w, const Input& in) {
  absl::Status s = in.target == 0 ? FuzzHeader(w, in) : FuzzPeer(w, in);
  // Whatever the input left behind (a Destroy that timed out keeps the
  // block) goes, so the next input starts from an empty name.
  (void)w.victim.alloc->FreeNamed(kBlockName);
  return s;
}

// The harness must exercise what it claims to: with no patches its hostile
// peer is a correct one, and every target and call succeeds (with a
// generous deadline: this runs on a loaded machine too).
void CheckTheCorrectPeerIsAccepted(World& w) {
  for (int target = 0; target < 4; ++target) {
    for (int call = 0; call < (target == 2 ? kCalls : 1); ++call) {
      for (bool large : {false, true}) {
        Input in;
        in.target = target;
        in.call = call;
        in.large = large;
        in.timeout = absl::Seconds(10);
        if (absl::Status s = Fuzz(w, in); !s.ok()) {
          Die(absl::StrCat("an unpatched peer (target ", target, ", call ", call,
                           large ? ", large" : "", ") was refused: ", s.ToString()));
        }
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::atexit([] { unlink(TheWorld().path.c_str()); });
  CheckTheCorrectPeerIsAccepted(TheWorld());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  Input in;
  in.target = data[0] % 4;
  in.call = (data[1] & 0x7f) % kCalls;
  in.large = data[1] & 0x80;
  in.reseal = data[2] & 1;
  in.patches = data + 3;
  in.patches_size = size - 3;
  (void)Fuzz(TheWorld(), in);  // any status will do; a crash or hang will not
  return 0;
}
