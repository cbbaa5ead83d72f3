// Knobs: the CXLRT_* environment variables that tune cxlrt, each declared
// once beside the code that reads it (name, type, default, one line of
// help), as NCCL's NCCL_PARAM and UCX's config tables are. Every
// declaration registers itself in one process-wide registry, which drives
// the parsing, `cxlrt doctor`'s listing and the README's table
// (tests/runtime/config_test.cc fails when the two drift apart).
//
//   // beside its user, at namespace scope in a .cc:
//   const runtime::Knob<uint32_t> kWaitSpins(
//       {"CXLRT_WAIT_SPINS", "2000", "Spin iterations of a wait before it yields."},
//       2000, runtime::UintIn(0, 100000000));
//   ... kWaitSpins.Get() ...
//
// A knob reads the environment once, at its first use; an empty variable is
// unset. A bad value never becomes a silent default: Get() then returns the
// default, and ConfigStatus() (which Pool::Create and Pool::Open return)
// names the variable and its value. ConfigStatus() checks the knobs this
// program links: a static link leaves out a file nothing references, and
// with it knobs the program never reads (a KV-only program does not check
// CXLRT_COMM_DEPTH); `cxlrt doctor` links every layer and checks them all.
//
// Options structs (AttachOptions, CommOptions, ...) spell "unset" one way:
// a field a knob can set is a std::optional, and nullopt takes the knob.
//
// Thread-safe: knobs are constructed during static initialisation and never
// destroyed (Knob and KnobRule are trivially destructible, their state on
// the heap), so a static destructor that runs after main, such as a
// cleanup guard that destroys a pool, still reads every knob's value. Get()
// may be called from any thread (and from another static initialiser, for
// a knob defined earlier in the same file). A test's own knob leaves the
// registry and frees its state with Retire().
#pragma once

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace cxlrt::runtime {

// What a knob says of itself: one row of the README's table.
struct KnobInfo {
  const char* name;          // CXLRT_...
  const char* default_text;  // the default as the README and doctor print it
  const char* help;          // one line
};

enum class KnobSource { kDefault, kEnvironment };
const char* KnobSourceName(KnobSource source);

// An environment to read knobs from: returns the value of a variable, or
// nullptr when it is unset (std::getenv, or a test's map).
using Getenv = std::function<const char*(const char*)>;

// Turns a knob's text into its value; the error message says what was
// wrong and names the variable (`name`) and its value.
template <typename T>
using KnobParser = std::function<absl::StatusOr<T>(const char* name, const std::string& text)>;

class KnobBase {
 public:
  KnobBase(const KnobBase&) = delete;
  KnobBase& operator=(const KnobBase&) = delete;

  const KnobInfo& info() const { return info_; }
  const char* name() const { return info_.name; }
  // The process's value of the variable; nullopt when unset or empty.
  const std::optional<std::string>& text() const;
  KnobSource source() const { return text() ? KnobSource::kEnvironment : KnobSource::kDefault; }
  // The variable as the environment holds it now (nullopt: unset or empty),
  // not the text read at first use: for callers that read it per call
  // (cxlrt::Host::Open's CXLRT_POOL) and tests that change it.
  std::optional<std::string> CurrentText() const {
    const char* v = std::getenv(info_.name);
    return v != nullptr && *v != 0 ? std::optional<std::string>(v) : std::nullopt;
  }
  // The text in effect: the environment's, else the default's.
  std::string ValueText() const { return text().value_or(info_.default_text); }
  // OK, or why the environment's value was refused (Get() is then the default).
  const absl::Status& status() const;
  // Checks this knob's value in `getenv` without touching the process's.
  virtual absl::Status Check(const Getenv& getenv) const = 0;
  // Leaves the registry (a knob at namespace scope never does).
  void Unregister() const;
  // Leaves the registry and frees the knob's state: for a test's own knob,
  // before it goes out of scope. The knob is not used after.
  void Retire() const;

 protected:
  explicit KnobBase(const KnobInfo& info);
  ~KnobBase() = default;  // trivial: see "Thread-safe" above
  // Parses the environment's text (called once, under the once flag).
  virtual absl::Status Load(const std::optional<std::string>& text) const = 0;
  // Frees the derived class's state (Retire).
  virtual void FreeState() const = 0;

 private:
  struct Loaded {  // never freed
    std::once_flag once;
    std::optional<std::string> text;
    absl::Status status;
  };
  void LoadOnce() const;

  const KnobInfo info_;
  Loaded* const loaded_;
};

template <typename T>
class Knob final : public KnobBase {
 public:
  Knob(const KnobInfo& info, T default_value, KnobParser<T> parse)
      : KnobBase(info), s_(new State{std::move(default_value), std::move(parse), std::nullopt}) {}

  // The process's value: the environment's, else the default (also when
  // the environment's is bad; ConfigStatus() reports that).
  const T& Get() const {
    (void)status();
    return s_->value ? *s_->value : s_->default_value;
  }
  // The value in the process's environment now, not the one read at first
  // use: for the few knobs that tests change while the process runs (a bad
  // value: the default).
  T Current() const {
    absl::StatusOr<T> v = Parse([](const char* n) { return std::getenv(n); });
    return v.ok() ? *std::move(v) : s_->default_value;
  }
  const T& default_value() const { return s_->default_value; }
  // The environment's value is in effect (set, and not refused).
  bool IsSet() const {
    (void)status();
    return s_->value.has_value();
  }

  // The value in `getenv` (unset or empty: the default), or the error.
  absl::StatusOr<T> Parse(const Getenv& getenv) const {
    const char* v = getenv(name());
    if (v == nullptr || *v == 0) return s_->default_value;
    return s_->parse(name(), v);
  }
  absl::Status Check(const Getenv& getenv) const override { return Parse(getenv).status(); }

 private:
  absl::Status Load(const std::optional<std::string>& text) const override {
    if (!text) return absl::OkStatus();
    absl::StatusOr<T> v = s_->parse(name(), *text);
    if (!v.ok()) return v.status();
    s_->value = *std::move(v);
    return absl::OkStatus();
  }
  void FreeState() const override { delete s_; }

  struct State {  // never freed
    const T default_value;
    const KnobParser<T> parse;
    std::optional<T> value;  // written once, under the once flag
  };
  State* const s_;
};

// A rule across knobs (the heartbeat below half the lease), declared beside
// its knobs at namespace scope and run by ConfigStatus() and CheckKnobs().
// `check` sees the environment through `getenv`; when a knob it reads is
// bad by itself it returns OK (that knob's own error is reported).
class KnobRule {
 public:
  explicit KnobRule(std::function<absl::Status(const Getenv& getenv)> check);
  KnobRule(const KnobRule&) = delete;
  KnobRule& operator=(const KnobRule&) = delete;
  absl::Status Check(const Getenv& getenv) const { return (*check_)(getenv); }

 private:
  const std::function<absl::Status(const Getenv&)>* const check_;  // never freed
};

// Every knob this program links, by name.
std::vector<const KnobBase*> Knobs();
// The knob named `name`, or nullptr.
const KnobBase* FindKnob(std::string_view name);

// OK, or the first bad knob of the process (or broken rule across knobs):
// kInvalidArgument naming the variable and its value. Pool::Create and
// Pool::Open return it, so a typo in CXLRT_LEASE_MS is never silent.
absl::Status ConfigStatus();
// The same for the environment `getenv` (tests).
absl::Status CheckKnobs(const Getenv& getenv);

// Parsers for the usual kinds of knob.
// An integer in [lo, hi]: "NAME='2s' is not an integer in [10, 3600000]".
KnobParser<uint32_t> UintIn(uint32_t lo, uint32_t hi);
// One of `words`: "NAME='x' is not a or b" / "... is not one of a, b, c".
KnobParser<std::string> OneOf(std::initializer_list<const char*> words);
// Any text (checked by its reader, or by Python).
KnobParser<std::string> AnyText();
// "1" is on; any other value is off (the Python package's flags, whose
// readers have always taken them so).
KnobParser<bool> OneIsOn();

// Knobs of the Python package (python/), declared in the registry so that
// `cxlrt doctor` and the README list them with the rest. The package's
// Python code reads CXLRT_TORCH_JIT, CXLRT_TORCH_BUILD_VERBOSE and
// CXLRT_TORCH_INTER_POD itself.
extern const Knob<bool>
    kTorchAsync;  // CXLRT_TORCH_ASYNC, read by python/csrc/torch_backend/backend.h

}  // namespace cxlrt::runtime
