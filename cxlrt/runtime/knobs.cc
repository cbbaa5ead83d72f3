#include "cxlrt/runtime/knobs.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <type_traits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace cxlrt::runtime {
namespace {

// Knobs and rules register from static initialisers of other files, so the
// registry is made on first use (never destroyed: knobs outlive main).
struct Registry {
  std::mutex mu;
  std::vector<const KnobBase*> knobs;  // guarded by mu
  std::vector<const KnobRule*> rules;  // guarded by mu
};

Registry& GetRegistry() {
  static Registry* r = new Registry;
  return *r;
}

std::vector<const KnobRule*> Rules() {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.rules;
}

}  // namespace

const char* KnobSourceName(KnobSource source) {
  return source == KnobSource::kEnvironment ? "environment" : "default";
}

// Knobs live as long as the process: a static destructor that runs after
// theirs would otherwise read a destroyed knob.
static_assert(std::is_trivially_destructible_v<Knob<std::string>>);
static_assert(std::is_trivially_destructible_v<Knob<uint32_t>>);
static_assert(std::is_trivially_destructible_v<KnobRule>);

KnobBase::KnobBase(const KnobInfo& info) : info_(info), loaded_(new Loaded) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.knobs.push_back(this);
}

void KnobBase::Unregister() const {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.knobs.erase(std::remove(r.knobs.begin(), r.knobs.end(), this), r.knobs.end());
}

void KnobBase::Retire() const {
  Unregister();
  FreeState();
  delete loaded_;
}

void KnobBase::LoadOnce() const {
  std::call_once(loaded_->once, [this] {
    if (const char* v = std::getenv(info_.name); v != nullptr && *v != 0) loaded_->text = v;
    loaded_->status = Load(loaded_->text);
  });
}

const std::optional<std::string>& KnobBase::text() const {
  LoadOnce();
  return loaded_->text;
}

const absl::Status& KnobBase::status() const {
  LoadOnce();
  return loaded_->status;
}

KnobRule::KnobRule(std::function<absl::Status(const Getenv& getenv)> check)
    : check_(new std::function<absl::Status(const Getenv&)>(std::move(check))) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.rules.push_back(this);
}

std::vector<const KnobBase*> Knobs() {
  Registry& r = GetRegistry();
  std::vector<const KnobBase*> out;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    out = r.knobs;
  }
  std::sort(out.begin(), out.end(), [](const KnobBase* a, const KnobBase* b) {
    return std::string_view(a->name()) < std::string_view(b->name());
  });
  return out;
}

const KnobBase* FindKnob(std::string_view name) {
  for (const KnobBase* k : Knobs()) {
    if (name == k->name()) return k;
  }
  return nullptr;
}

absl::Status ConfigStatus() {
  for (const KnobBase* k : Knobs()) {
    if (!k->status().ok()) return k->status();
  }
  // Rules see the texts the knobs took (each knob reads the environment
  // once), so that they judge the values in effect.
  const Getenv process = [](const char* name) -> const char* {
    if (const KnobBase* k = FindKnob(name)) return k->text() ? k->text()->c_str() : nullptr;
    return std::getenv(name);
  };
  for (const KnobRule* rule : Rules()) {
    if (absl::Status s = rule->Check(process); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status CheckKnobs(const Getenv& getenv) {
  for (const KnobBase* k : Knobs()) {
    if (absl::Status s = k->Check(getenv); !s.ok()) return s;
  }
  for (const KnobRule* rule : Rules()) {
    if (absl::Status s = rule->Check(getenv); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// The Python package's knobs (knobs.h says why they are declared here).
const Knob<bool> kTorchAsync(
    {"CXLRT_TORCH_ASYNC", "0",
     "1: the torch backend queues every call for its worker thread, even when it is idle "
     "(compute may then overlap communication); docs/python.md."},
    false, OneIsOn());
namespace {
const Knob<bool> kTorchJit(
    {"CXLRT_TORCH_JIT", "0",
     "1: `import cxlrt.torch_backend` builds the backend with torch.utils.cpp_extension against "
     "the installed libcxlrt instead of loading the prebuilt module."},
    false, OneIsOn());
const Knob<std::string> kTorchBuildVerbose(
    {"CXLRT_TORCH_BUILD_VERBOSE", "",
     "Not empty: the CXLRT_TORCH_JIT build prints its compiler commands."},
    "", AnyText());
const Knob<std::string> kTorchInterPod(
    {"CXLRT_TORCH_INTER_POD", "auto",
     "The engine between pods of the torch backend's groups that span several pools: auto "
     "(Gloo for CPU tensors, NCCL for CUDA tensors), gloo or nccl; docs/python.md, \"Across "
     "pods\"."},
    "auto", OneOf({"auto", "gloo", "nccl"}));
}  // namespace

KnobParser<uint32_t> UintIn(uint32_t lo, uint32_t hi) {
  return [lo, hi](const char* name, const std::string& text) -> absl::StatusOr<uint32_t> {
    uint32_t v = 0;
    if (!absl::SimpleAtoi(text, &v) || v < lo || v > hi) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, "='", text, "' is not an integer in [", lo, ", ", hi, "]"));
    }
    return v;
  };
}

KnobParser<std::string> OneOf(std::initializer_list<const char*> words) {
  std::vector<std::string> list(words.begin(), words.end());
  return [list](const char* name, const std::string& text) -> absl::StatusOr<std::string> {
    if (std::find(list.begin(), list.end(), text) != list.end()) return text;
    const std::string which = list.size() == 2 ? absl::StrCat(list[0], " or ", list[1])
                                               : absl::StrCat("one of ", absl::StrJoin(list, ", "));
    return absl::InvalidArgumentError(absl::StrCat(name, "='", text, "' is not ", which));
  };
}

KnobParser<std::string> AnyText() {
  return [](const char*, const std::string& text) -> absl::StatusOr<std::string> { return text; };
}

KnobParser<bool> OneIsOn() {
  return [](const char*, const std::string& text) -> absl::StatusOr<bool> { return text == "1"; };
}

}  // namespace cxlrt::runtime
