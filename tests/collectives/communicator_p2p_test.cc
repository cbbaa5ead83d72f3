// Send and Recv across emulated hosts (forked processes): mismatched
// sizes, messages of 0 to hundreds of chunks around the channel ring, the
// channels' size, their flow control and the probes that never wait. Both
// the hardware and the simulated coherence domain.
#include <sys/mman.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cxlrt/allocator/allocator.h"
#include "cxlrt/collectives/comm_layout.h"
#include "cxlrt/collectives/communicator.h"
#include "cxlrt/collectives/copy_engine.h"
#include "gtest/gtest.h"
#include "tests/collectives/communicator_test_util.h"
#include "tests/collectives/late_engine.h"
#include "tests/testing/test_util.h"

namespace cxlrt::collectives {
namespace {

using runtime::CoherenceDomain;

TEST_P(CollectivesTest, ASendMeetingARecvOfAnotherSizeIsAnError) {
  RunRanks(
      2,
      [](Communicator& comm, allocator::Allocator&) -> std::string {
        std::vector<float> v(100);
        absl::Status s = comm.rank() == 0 ? comm.Send(v.data(), 100, DataType::kFloat32, 1)
                                          : comm.Recv(v.data(), 50, DataType::kFloat32, 0);
        if (comm.rank() == 1) {
          if (s.code() != absl::StatusCode::kInvalidArgument ||
              std::string(s.message()).find("count=100") == std::string::npos) {
            return "no mismatch: " + s.ToString();
          }
        } else if (!s.ok()) {
          return "send: " + s.ToString();
        }
        comm.Abort();
        return "";
      },
      absl::Seconds(60), {}, "p2p");
}

// Send/Recv messages of 0 to hundreds of chunks around a ring of three
// ranks, every rank sending and receiving, through chunks of 256 B (a ring
// of kP2pSlots per channel, wrapped many times). With the CPU engine, and
// with the late engine (device-like): a chunk published before its copy
// into the pool completed, or marked consumed while its copy out still
// reads it, hands over wrong bytes.
TEST_P(CollectivesTest, SendAndRecvStayExactThroughTheChannelRing) {
  std::vector<LateEngine*> late(3, nullptr);
  for (bool late_engine : {false, true}) {
    SCOPED_TRACE(late_engine ? "late engine" : "cpu engine");
    engine_factory_ = nullptr;
    if (late_engine) {
      engine_factory_ = [&](runtime::Coherence& c, int r) -> std::unique_ptr<CopyEngine> {
        auto e = std::make_unique<LateEngine>(c, 99 + r, /*device_like=*/true);
        late[r] = e.get();
        return e;
      };
    }
    CommOptions o;
    o.p2p_bytes = 1024;
    RunRanks(
        3,
        [&](Communicator& comm, allocator::Allocator&) -> std::string {
          const int n = comm.size(), r = comm.rank();
          const int to = (r + 1) % n, from = (r + n - 1) % n;
          for (size_t count : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{65},
                               size_t{1000}, size_t{100003}}) {
            std::vector<uint32_t> out(count), in(count, 0xdeadbeef);
            for (size_t i = 0; i < count; ++i) out[i] = static_cast<uint32_t>(r * 1000003 + i);
            // Rank 0 receives first, the others send first: no cycle of
            // blocked sends, and messages longer than the ring block.
            for (int step = 0; step < 2; ++step) {
              absl::Status s = ((r == 0) == (step == 1))
                                   ? comm.Send(out.data(), count, DataType::kUint32, to)
                                   : comm.Recv(in.data(), count, DataType::kUint32, from);
              if (!s.ok()) return absl::StrCat("count ", count, ": ", s.ToString());
            }
            for (size_t i = 0; i < count; ++i) {
              if (in[i] != static_cast<uint32_t>(from * 1000003 + i)) {
                return absl::StrCat("count ", count, ": element ", i, " from rank ", from, " is ",
                                    in[i]);
              }
            }
          }
          if (late[r] != nullptr && late[r]->most_pending() < 2) {
            return "the late engine never had two chunks in flight";
          }
          return "";
        },
        absl::Seconds(120), o, "p2p");
    if (HasFailure()) return;
  }
}

// Unset, a channel is the largest power of two in [64 KiB, 1 MiB] whose
// n x n channels take at most 1/16 of the pool (512 MiB here); rank 0's
// choice holds for every rank, and a given size is rounded up to whole
// chunk lines.
TEST_P(CollectivesTest, SendRecvChannelsAreSizedByThePoolUnlessTold) {
  for (auto [n, told, want] :
       {std::tuple{2, 0, 1 << 20}, std::tuple{8, 0, 512 << 10}, std::tuple{2, 1000, 1024}}) {
    SCOPED_TRACE(absl::StrCat(n, " ranks, told ", told));
    CommOptions o;
    o.p2p_bytes = told;
    RunRanks(
        n,
        [&, want = want](Communicator& comm, allocator::Allocator&) -> std::string {
          if (comm.p2p_bytes() != static_cast<uint64_t>(want)) {
            return absl::StrCat("channels of ", comm.p2p_bytes(), " bytes, not ", want);
          }
          return "";
        },
        absl::Seconds(60), o, "p2p");
    if (HasFailure()) return;
  }
}

// The channel's flow control, told by causality rather than time: a Send
// of kP2pSlots chunks fits the ring and returns before its Recv begins; a
// Send of one chunk more returns only after its Recv has begun.
TEST_P(CollectivesTest, ASendRunsAheadOfItsReceiverByTheRingAndNoFurther) {
  auto* sh = static_cast<std::atomic<int>*>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(sh, MAP_FAILED);
  std::atomic<int>& sent = sh[0];     // rank 0: Sends returned
  std::atomic<int>& started = sh[1];  // rank 1: Recvs begun
  CommOptions o;
  o.p2p_bytes = 1024;                             // kP2pSlots chunks of 256 B
  const size_t fits = 1024 / 4, more = fits + 1;  // floats
  RunRanks(
      2,
      [&](Communicator& comm, allocator::Allocator&) -> std::string {
        std::vector<float> a(fits, 1.0f), b(more, 2.0f);
        if (comm.rank() == 0) {
          absl::Status s = comm.Send(a.data(), fits, DataType::kFloat32, 1);
          if (!s.ok()) return s.ToString();
          sent = 1;
          s = comm.Send(b.data(), more, DataType::kFloat32, 1);
          if (!s.ok()) return s.ToString();
          if (started.load() < 2)
            return "a Send longer than the ring returned before its Recv began";
          return "";
        }
        const absl::Time deadline = absl::Now() + absl::Seconds(30);
        while (sent.load() == 0) {
          if (absl::Now() > deadline) return "a Send that fits the ring did not return";
          absl::SleepFor(absl::Milliseconds(1));
        }
        started = 1;
        absl::Status s = comm.Recv(a.data(), fits, DataType::kFloat32, 0);
        if (!s.ok()) return s.ToString();
        started = 2;
        s = comm.Recv(b.data(), more, DataType::kFloat32, 0);
        if (!s.ok()) return s.ToString();
        if (a != std::vector<float>(fits, 1.0f) || b != std::vector<float>(more, 2.0f)) {
          return "wrong bytes received";
        }
        return "";
      },
      absl::Seconds(60), o, "p2p");
  munmap(sh, 4096);
}

// The probes a caller uses to drive p2p without waiting (the torch
// backend's p2p thread): SendFits says whether a Send's chunks fit the ring
// now, RecvReady whether the next Send's first chunk is posted.
TEST_P(CollectivesTest, TheP2pProbesSayWhenASendFitsAndWhenARecvCanStart) {
  auto* sh = static_cast<std::atomic<int>*>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(sh, MAP_FAILED);
  std::atomic<int>& step = sh[0];  // 1: rank 1 probed an empty channel; 2: rank 0 sent;
                                   // 3: rank 1 received
  CommOptions o;
  o.p2p_bytes = 1024;  // kP2pSlots chunks of 256 B
  RunRanks(
      2,
      [&](Communicator& comm, allocator::Allocator&) -> std::string {
        auto await = [&](int v) {
          const absl::Time deadline = absl::Now() + absl::Seconds(30);
          while (step.load() < v) {
            if (absl::Now() > deadline) return false;
            absl::SleepFor(absl::Milliseconds(1));
          }
          return true;
        };
        std::vector<uint8_t> buf(768, 7);
        if (comm.rank() == 0) {
          if (!comm.SendFits(1, 1024)) return "4 chunks do not fit an empty ring";
          if (comm.SendFits(1, 1025)) return "5 chunks fit a ring of 4";
          if (comm.SendFits(0, 1) || comm.SendFits(2, 1)) return "a bad peer fits";
          if (!await(1)) return "rank 1 did not probe";
          absl::Status s = comm.Send(buf.data(), 768, DataType::kUint8, 1);  // 3 chunks
          if (!s.ok()) return s.ToString();
          if (!comm.SendFits(1, 256) || comm.SendFits(1, 512)) {
            return "after 3 unconsumed chunks, room is not 1 chunk";
          }
          step = 2;
          if (!await(3)) return "rank 1 did not receive";
          if (!comm.SendFits(1, 1024)) return "the ring is not empty after its Recv";
          return "";
        }
        if (comm.RecvReady(0)) return "a Recv can start before any Send";
        step = 1;
        if (!await(2)) return "rank 0 did not send";
        if (!comm.RecvReady(0)) return "a posted Send is not seen";
        std::vector<uint8_t> got(768);
        absl::Status s = comm.Recv(got.data(), 768, DataType::kUint8, 0);
        if (!s.ok()) return s.ToString();
        if (got != buf) return "wrong bytes received";
        if (comm.RecvReady(0)) return "a Recv can start after the only Send was received";
        step = 3;
        return "";
      },
      absl::Seconds(60), o, "probes");
  munmap(sh, 4096);
}

INSTANTIATE_TEST_SUITE_P(Domains, CollectivesTest,
                         ::testing::Values(CoherenceDomain::kHardware,
                                           CoherenceDomain::kSimulated));

}  // namespace
}  // namespace cxlrt::collectives
