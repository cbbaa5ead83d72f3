// Making and ending a group of the torch backend (backend.h): the
// process's shared attachment to the pool, the group's names and
// communicators, and the module torch_backend.py loads (create, and the
// ProcessGroup it hands torch).
#include <pybind11/chrono.h>
#include <torch/extension.h>

#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <vector>

#include "absl/strings/str_cat.h"
#include "python/csrc/torch_backend/backend.h"

namespace cxlrt::torch_backend {

std::shared_ptr<SharedHost> HostFor(const std::string& uri, const std::string& who) {
  // Never destroyed: backends may outlive static destruction at exit.
  static auto* mu = new std::mutex;
  static auto* hosts = new std::map<std::string, std::weak_ptr<SharedHost>>;
  std::lock_guard<std::mutex> l(*mu);
  if (std::shared_ptr<SharedHost> h = (*hosts)[uri].lock()) return h;
  auto fail = [&](const absl::Status& s, const char* what) {
    Raise(absl::Status(s.code(), absl::StrCat(who, " ", what, " ", uri, ": ", s.message())));
  };
  auto h = std::make_shared<SharedHost>();
  auto pool = runtime::Pool::Open(uri);
  if (!pool.ok()) fail(pool.status(), "opening the pool");
  h->pool = *std::move(pool);
  runtime::AttachOptions attach;
  attach.host_id = -1;  // any free host slot: each process is a host of its own
  auto membership = runtime::Membership::Attach(*h->pool, attach);
  if (!membership.ok()) fail(membership.status(), "attaching to");
  h->membership = *std::move(membership);
  auto alloc = allocator::Allocator::Open(*h->pool, *h->membership);
  if (!alloc.ok()) fail(alloc.status(), "opening the allocator of");
  h->alloc = *std::move(alloc);
  (*hosts)[uri] = h;
  return h;
}

CxlrtBackend::CxlrtBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                           std::chrono::milliseconds timeout, const std::string& pool_uri)
    : Backend(rank, size), store_(store), timeout_(timeout) {
  // Rank 0 makes the pool when it does not exist, and names the
  // communicators; the others wait for both through the store (torch
  // gives each group a store of its own). A group made again after
  // destroy_process_group gets the same store keys, and the earlier
  // group's name is still there: each making of the group counts itself
  // (every rank adds 1, and no rank makes the next one before all have
  // made this one: Create below waits for all), and its name has a key
  // of its own.
  made_ = (store->add("cxlrt/made", 1) - 1) / size;
  const std::string key = absl::StrCat("cxlrt/communicator/", made_);
  if (rank == 0) {
    // Made here unless the caller made it (torch_backend.py does, so
    // that the pool goes when the job's process exits).
    auto made = runtime::Pool::Create(pool_uri);
    if (!made.ok() && !absl::IsAlreadyExists(made.status())) Raise(made.status());
    std::random_device rd;
    name_ = absl::StrCat("torch-", rd(), "-", rd());
    store->set(key, std::vector<uint8_t>(name_.begin(), name_.end()));
  } else {
    const std::vector<uint8_t> got = store->get(key);
    name_.assign(got.begin(), got.end());
  }
  host_ = HostFor(pool_uri, absl::StrCat("rank ", rank, " of ", size));
  // The p2p communicator now, while every rank is here: its calls involve
  // only two ranks. It runs no collective but Destroy's barrier, so its
  // data slots are the smallest there are. Its channels (n x n of them)
  // are 256 KiB, a quarter of the communicator's default, so that a group
  // of 2 ranks costs about 1 MiB of the pool until it runs a collective,
  // and a 1 GiB pool holds the 40 used groups Gloo makes (the collective
  // communicator's slots take 4 MiB a rank); CXLRT_COMM_P2P_BYTES sets
  // them.
  collectives::CommOptions o;
  if (timeout.count() > 0) o.timeout = absl::FromChrono(timeout);  // else the knob
  o.slot_bytes = 64;
  o.depth = collectives::kMinDepth;
  const runtime::KnobBase* p2p_knob = runtime::FindKnob("CXLRT_COMM_P2P_BYTES");
  if (p2p_knob == nullptr || !p2p_knob->text()) o.p2p_bytes = 256 << 10;
  auto p2p = collectives::Communicator::Create(*host_->alloc, name_ + "-p2p", size, rank, o);
  if (!p2p.ok()) {
    Raise(absl::Status(p2p.status().code(),
                       absl::StrCat("rank ", rank, " of ", size, " making the group's p2p ",
                                    "communicator: ", p2p.status().message())));
  }
  p2p_ = *std::move(p2p);
  in_.resize(size);
  sends_.resize(size);
  sent_at_.resize(size);
  received_at_.resize(size);
}

void CxlrtBackend::shutdown() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  {
    std::lock_guard<std::mutex> l(p2p_mu_);
    p2p_stop_ = true;
  }
  p2p_cv_.notify_all();
  if (p2p_thread_.joinable()) p2p_thread_.join();
}

CxlrtBackend::~CxlrtBackend() {
  shutdown();
  comm_.reset();  // Destroy: a barrier, then rank 0 waits until every rank has left
  p2p_.reset();
  host_.reset();
}

c10::intrusive_ptr<c10d::Backend> CxlrtBackend::Create(const c10::intrusive_ptr<c10d::Store>& store,
                                                       int rank, int size,
                                                       std::chrono::milliseconds timeout,
                                                       const std::string& pool_uri) {
  return c10::make_intrusive<CxlrtBackend>(store, rank, size, timeout, pool_uri);
}

void CxlrtBackend::abort() {
  // Abort only marks the pool's words; it is safe beside a call in flight.
  const std::string why = absl::StrCat("rank ", rank_, " of ", size_, " aborted its group");
  std::lock_guard<std::mutex> l(mu_);
  if (comm_) comm_->Abort(why);
  if (p2p_) p2p_->Abort(why);
}

absl::StatusOr<collectives::Communicator*> CxlrtBackend::Comm() {
  if (comm_) return comm_.get();
  if (!comm_status_.ok()) return comm_status_;
  collectives::CommOptions o;
  if (timeout_.count() > 0) o.timeout = absl::FromChrono(timeout_);  // else the knob
  o.p2p_bytes = 256;  // the smallest channels: its Send/Recv are unused
  auto comm = collectives::Communicator::Create(*host_->alloc, name_, size_, rank_, o);
  if (!comm.ok()) {
    comm_status_ =
        absl::Status(comm.status().code(),
                     absl::StrCat("making the group's communicator (rank ", rank_, " of ", size_,
                                  ", at the group's first collective): ", comm.status().message()));
    return comm_status_;
  }
  comm_ = *std::move(comm);
  return comm_.get();
}

namespace {

// The group torch_backend.py hands torch: torch's ProcessGroup named
// "cxlrt". Torch makes a plugin's group a ProcessGroup of type CUSTOM, whose
// getBackendName() ("custom") DDP's logger records
// (torch/csrc/distributed/c10d/logger.cpp: strs_map["backend_name"]).
class CxlrtProcessGroup : public c10d::ProcessGroup {
 public:
  using c10d::ProcessGroup::ProcessGroup;
  const std::string getBackendName() const override { return "cxlrt"; }
};

}  // namespace

// The pool's creation_id as 16 hex digits: what names a pod (two URIs of
// one pool give the same; one name made on two hosts gives two).
std::string PoolIdentity(const std::string& uri) {
  auto pool = runtime::Pool::Open(uri);
  if (!pool.ok()) {
    Raise(absl::Status(pool.status().code(),
                       absl::StrCat("opening the pool ", uri, ": ", pool.status().message())));
  }
  return absl::StrCat(absl::Hex((*pool)->header().creation_id, absl::kZeroPad16));
}

}  // namespace cxlrt::torch_backend

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("create", &cxlrt::torch_backend::CxlrtBackend::Create, py::arg("store"), py::arg("rank"),
        py::arg("size"), py::arg("timeout"), py::arg("pool"),
        "A cxlrt c10d backend for rank `rank` of `size` over the pool `pool`.");
  m.def("pool_identity", &cxlrt::torch_backend::PoolIdentity, py::arg("pool"),
        "The creation_id of the pool `pool` (16 hex digits): it names the pool's pod.");
  py::class_<cxlrt::torch_backend::CxlrtProcessGroup, c10d::ProcessGroup,
             c10::intrusive_ptr<cxlrt::torch_backend::CxlrtProcessGroup>>(m, "ProcessGroup",
                                                                          py::dynamic_attr())
      .def(py::init<c10::intrusive_ptr<c10d::Store>, int, int>(), py::arg("store"), py::arg("rank"),
           py::arg("size"));
}
