#include "cxlrt/runtime/fault.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <mutex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cxlrt/runtime/coherence.h"
#include "cxlrt/runtime/knobs.h"
#include "cxlrt/runtime/log.h"

namespace cxlrt::runtime {
namespace {

constexpr FaultPointInfo kFaultPoints[] = {
    {"pool.create.before_magic",
     "the new pool's header body is published (corrupt: damages it); its magic is not"},
    {"pool.check.between_lines",
     "a pool check read a host slot's owner line; its control line is not read yet"},
    {"coherence.publish",
     "a Publish() wrote and flushed its range (corrupt: damages its last byte)"},
    {"bakery.after_choosing", "the bakery ticket says choosing; no number taken yet"},
    {"bakery.locked", "the pool lock is held; nothing written under it yet"},
    {"membership.claim.locked", "attach holds the pool lock; the slot's control line is unchanged"},
    {"membership.claim.after_control",
     "attach wrote the slot's control line (attached, new epoch); the owner line still has the "
     "old epoch; the lock is held"},
    {"membership.heartbeat", "the heartbeat thread is about to beat"},
    {"membership.renew.checked",
     "a lease renewal stored its beat and fenced; it has not read its control line yet"},
    {"membership.fence.locked",
     "fence holds the pool lock; the victim's control line is unchanged"},
    {"membership.detach.locked", "detach holds the pool lock; the slot is still attached"},
    {"membership.detach.freed",
     "detach wrote the slot's control line free at the next epoch; the heartbeat thread still "
     "runs; the lock is held"},
    {"alloc.claim.after_entry",
     "a segment claim wrote the segment's table entry (owned, under the pool lock); its header is "
     "not initialised"},
    {"alloc.huge.after_tails",
     "a huge allocation marked its tail segments; its head entry is not written"},
    {"alloc.tick.begin",
     "the allocator's tick is about to run (drain rings, publish counters); nothing is checked or "
     "written yet"},
    {"alloc.batch.begin",
     "an arena batch is about to re-read its arena's owner epoch and mark its seqlock odd; the "
     "slow path's lease check has passed"},
    {"alloc.redo.intent",
     "CommitDurable / FreeDurable found its arena still its own; its intent record is about to be "
     "written"},
    {"alloc.allocate.done",
     "a small block is marked allocated and handed out; the caller has not got it yet"},
    {"alloc.free.after_bitmap",
     "a free wrote cleared alloc bits back to the pool (its cache was full); the arena's counters "
     "are not yet published"},
    {"alloc.remote_free.after_entry",
     "a remote free wrote its ring entry; the ring head is not yet published"},
    {"alloc.recover.reclaimed",
     "recovery freed a dead arena's private blocks; its counters and rings are not yet done"},
    {"alloc.redo.written",
     "CommitDurable / FreeDurable published its intent record; the block and the word are "
     "unchanged"},
    {"alloc.redo.block_changed",
     "CommitDurable / FreeDurable changed the block (durable, or freed); the word is not stored "
     "and the intent record is still set"},
    {"kv.put.copied",
     "a KV put copied its value into its (private) block; its entry is written but not sealed"},
    {"kv.create.zeroed",
     "a new KV store's block is allocated and zeroed; its header is not written yet"},
    {"kv.evict.unsealed",
     "a KV eviction unsealed its entries (state evicting); their blocks are still durable"},
    {"coll.post.begin",
     "a rank is about to stage a post of a collective round; its lease is not checked and its "
     "slot not written yet"},
    {"coll.round.posted",
     "a rank published its post of a collective round (data and descriptor); its round flag is "
     "not yet stored"},
};

std::mutex g_mu;
std::vector<FaultRule>* g_rules = nullptr;          // guarded by g_mu
std::map<std::string, uint64_t>* g_hits = nullptr;  // guarded by g_mu
std::once_flag g_env_once;

// Defined before kEnvArmed, which reads it during static initialisation.
const Knob<std::string> kFault(
    {"CXLRT_FAULT", "", "Fault points to fire: point:action[:count],... (docs/faults.md)."}, "",
    [](const char* name, const std::string& text) -> absl::StatusOr<std::string> {
      if (auto rules = ParseFaultSpec(text); !rules.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(name, ": ", rules.status().message()));
      }
      return text;
    });

void ArmFromEnvironment() {
  const std::string& spec = kFault.Get();
  if (spec.empty()) return;
  if (absl::Status s = ArmFaults(spec); !s.ok()) {
    CXLRT_LOG(kError) << "CXLRT_FAULT ignored: " << s;
  }
}

// Arms CXLRT_FAULT before main() so that the first point already sees it.
[[maybe_unused]] const bool kEnvArmed = [] {
  std::call_once(g_env_once, ArmFromEnvironment);
  return true;
}();

}  // namespace

namespace fault_internal {
std::atomic<bool> armed{false};

void Hit(const char* point, Coherence* coherence, uint64_t offset, size_t n) {
  FaultRule fire;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_rules == nullptr) return;
    uint64_t hits = ++(*g_hits)[point];
    const FaultRule* match = nullptr;
    for (const FaultRule& r : *g_rules) {
      if (r.point == point && r.count == hits) match = &r;
    }
    if (match == nullptr) return;
    fire = *match;
  }
  switch (fire.action) {
    case FaultAction::kCrash: {
      std::string msg =
          absl::StrCat("cxlrt: fault point ", point, ": crash (pid ", getpid(), ")\n");
      ssize_t ignored = write(STDERR_FILENO, msg.data(), msg.size());
      (void)ignored;
      _exit(kFaultExitCode);
    }
    case FaultAction::kStall:
      CXLRT_LOG(kWarning) << "fault point " << point << ": stall " << fire.stall_ms << " ms";
      absl::SleepFor(absl::Milliseconds(fire.stall_ms));
      return;
    case FaultAction::kStop: {
      // Only this process stops; its threads stop with it (SIGSTOP stops
      // the whole thread group). A driver sends SIGCONT.
      std::string msg = absl::StrCat("cxlrt: fault point ", point, ": stop (pid ", getpid(), ")\n");
      ssize_t ignored = write(STDERR_FILENO, msg.data(), msg.size());
      (void)ignored;
      raise(SIGSTOP);
      return;
    }
    case FaultAction::kCorrupt:
      if (coherence == nullptr || n == 0) {
        CXLRT_LOG(kError) << "fault point " << point << " has no written line to corrupt";
        return;
      }
      {
        uint8_t byte = 0;
        coherence->Read(&byte, offset + n - 1, 1);
        byte ^= 0xFF;
        coherence->Write(offset + n - 1, &byte, 1);
        coherence->Flush(offset + n - 1, 1);
      }
      CXLRT_LOG(kWarning) << "fault point " << point << ": corrupted pool offset 0x" << std::hex
                          << offset + n - 1;
      return;
  }
}
}  // namespace fault_internal

std::span<const FaultPointInfo> FaultPoints() { return kFaultPoints; }

absl::StatusOr<std::vector<FaultRule>> ParseFaultSpec(absl::string_view spec) {
  std::vector<FaultRule> rules;
  for (absl::string_view item : absl::StrSplit(spec, ',', absl::SkipEmpty())) {
    std::vector<std::string> parts = absl::StrSplit(item, ':');
    if (parts.size() < 2 || parts.size() > 3) {
      return absl::InvalidArgumentError(
          absl::StrCat("fault '", item,
                       "' is not point:action[:count] (actions: crash, stall=MS, stop, corrupt)"));
    }
    FaultRule r;
    r.point = parts[0];
    bool known = false;
    for (const FaultPointInfo& p : kFaultPoints) known |= r.point == p.name;
    if (!known) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown fault point '", r.point, "' (docs/faults.md lists them)"));
    }
    const std::string& action = parts[1];
    if (action == "crash") {
      r.action = FaultAction::kCrash;
    } else if (action == "stop") {
      r.action = FaultAction::kStop;
    } else if (action == "corrupt") {
      r.action = FaultAction::kCorrupt;
    } else if (action.rfind("stall=", 0) == 0 && absl::SimpleAtoi(action.substr(6), &r.stall_ms) &&
               r.stall_ms <= 3600000) {
      r.action = FaultAction::kStall;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("fault action '", action, "' in '", item,
                                                     "' is not crash, stall=MS, stop or corrupt"));
    }
    if (parts.size() == 3 && (!absl::SimpleAtoi(parts[2], &r.count) || r.count == 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("fault count '", parts[2], "' in '", item, "' is not a positive integer"));
    }
    rules.push_back(std::move(r));
  }
  return rules;
}

absl::Status ArmFaults(absl::string_view spec) {
  auto rules = ParseFaultSpec(spec);
  if (!rules.ok()) return rules.status();
  std::lock_guard<std::mutex> lock(g_mu);
  delete g_rules;
  delete g_hits;
  g_rules = new std::vector<FaultRule>(std::move(*rules));
  g_hits = new std::map<std::string, uint64_t>();
  fault_internal::armed.store(!g_rules->empty());
  return absl::OkStatus();
}

}  // namespace cxlrt::runtime
