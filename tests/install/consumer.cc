// Uses every layer of an installed cxlrt: makes an emulated pool in the
// directory it is given, attaches, allocates, puts and gets a KV value and
// runs a one-rank all-reduce; then does the same through the front door
// (cxlrt/cxlrt.h) on a second pool, its store outliving the Host handle.
// Prints "consumer: ok" and exits 0, or says what failed and exits 1.
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "cxlrt/allocator/allocator.h"
#include "cxlrt/collectives/communicator.h"
#include "cxlrt/cxlrt.h"
#include "cxlrt/kv/store.h"
#include "cxlrt/runtime/membership.h"
#include "cxlrt/runtime/pool.h"

namespace {

int Fail(const char* what, const absl::Status& s) {
  std::fprintf(stderr, "consumer: %s: %s\n", what, s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace cxlrt;
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer DIR\n");
    return 2;
  }
  const std::string uri = std::string("emu://consumer?dir=") + argv[1];
  auto pool = runtime::Pool::Create(uri + "&size=64M");
  if (!pool.ok()) return Fail("pool", pool.status());
  runtime::AttachOptions ao;
  ao.host_id = -1;
  auto host = runtime::Membership::Attach(**pool, ao);
  if (!host.ok()) return Fail("attach", host.status());
  auto alloc = allocator::Allocator::Open(**pool, **host);
  if (!alloc.ok()) return Fail("allocator", alloc.status());
  {
    kv::StoreOptions so;
    so.create = true;
    auto store = kv::Store::Open(**alloc, so);
    if (!store.ok()) return Fail("kv open", store.status());
    const char value[] = "a block of KV cache";
    if (absl::Status s = (*store)->Put("prefix", "page-0", value, sizeof(value)); !s.ok()) {
      return Fail("kv put", s);
    }
    char got[64] = {};
    auto n = (*store)->Get("prefix", "page-0", got, sizeof(got));
    if (!n.ok()) return Fail("kv get", n.status());
    if (*n != sizeof(value) || std::memcmp(got, value, sizeof(value)) != 0) {
      std::fprintf(stderr, "consumer: kv get returned other bytes\n");
      return 1;
    }
  }
  {
    auto comm = collectives::Communicator::Create(**alloc, "consumer", 1, 0);
    if (!comm.ok()) return Fail("communicator", comm.status());
    float x[4] = {1, 2, 3, 4}, y[4] = {};
    absl::Status s =
        (*comm)->AllReduce(x, y, 4, collectives::DataType::kFloat32, collectives::RedOp::kSum);
    if (!s.ok()) return Fail("all-reduce", s);
    if (y[3] != 4.0f) {
      std::fprintf(stderr, "consumer: all-reduce gave %f\n", y[3]);
      return 1;
    }
    if (absl::Status d = (*comm)->Destroy(); !d.ok()) return Fail("destroy", d);
  }
  if (absl::Status s = (*alloc)->Close(); !s.ok()) return Fail("close", s);
  if (absl::Status s = (*host)->Detach(); !s.ok()) return Fail("detach", s);

  // The front door: one call instead of the four objects above.
  std::shared_ptr<kv::Store> store;
  {
    HostOptions ho;
    ho.create = true;
    ho.attach.host_id = -1;
    auto front = Host::Open(std::string("emu://consumer-front?size=64M&dir=") + argv[1], ho);
    if (!front.ok()) return Fail("front door", front.status());
    kv::StoreOptions so;
    so.create = true;
    auto s = front->OpenStore(so);
    if (!s.ok()) return Fail("front door store", s.status());
    store = *std::move(s);
  }  // the Host handle is gone; the store keeps what it uses
  const char value[] = "kept by the store";
  if (absl::Status s = store->Put("prefix", "page-1", value, sizeof(value)); !s.ok()) {
    return Fail("front door put", s);
  }
  char got[64] = {};
  auto n = store->Get("prefix", "page-1", got, sizeof(got));
  if (!n.ok()) return Fail("front door get", n.status());
  if (*n != sizeof(value) || std::memcmp(got, value, sizeof(value)) != 0) {
    std::fprintf(stderr, "consumer: front door get returned other bytes\n");
    return 1;
  }
  store.reset();
  std::printf("consumer: ok\n");
  return 0;
}
