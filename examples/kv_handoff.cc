// Prefill (rank 0) puts a chain of KV-cache blocks into the pool; decode
// (rank 1) finds the longest cached prefix, pins it and reads it into its
// own buffers (examples/kv_handoff.py in C++):
//   cxlrt run -n 2 build/bin/example_kv_handoff
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cxlrt/cxlrt.h"

namespace {

// Ends the program saying what failed when `s` is an error.
void Check(const absl::Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "kv_handoff: %s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

}  // namespace

int main() {
  constexpr size_t kBlock = 16 * 1024;  // bytes of one block of KV for a token block
  std::vector<std::string> chain;       // chained hashes in a real server
  for (int i = 0; i < 8; ++i) chain.push_back("seq-7/blk-" + std::to_string(i));

  auto host = cxlrt::Host::Open();  // the pool cxlrt run made (CXLRT_POOL)
  Check(host.status(), "open the host");
  auto comm = host->CreateCommunicator("handoff");  // rank and size from the launcher
  Check(comm.status(), "join the communicator");
  cxlrt::kv::StoreOptions options;
  options.create = (*comm)->rank() == 0;
  if ((*comm)->rank() == 0) {
    auto store = host->OpenStore(options);
    Check(store.status(), "open the store");
    std::vector<std::vector<uint8_t>> blocks;  // 6 of 8 computed
    std::vector<cxlrt::kv::PutItem> items;
    for (int i = 0; i < 6; ++i) {
      blocks.emplace_back(kBlock, static_cast<uint8_t>(i));
      cxlrt::kv::PutItem item;
      item.key = chain[i];
      item.data = blocks.back().data();
      item.size = kBlock;
      items.push_back(item);
    }
    for (const absl::Status& s : (*store)->BatchPut("llama-8b", items)) Check(s, "put a block");
    Check((*comm)->Barrier(), "hand off");
    Check((*comm)->Barrier(), "wait for decode");
  } else {
    Check((*comm)->Barrier(), "wait for prefill");
    auto store = host->OpenStore(options);
    Check(store.status(), "open the store");
    cxlrt::kv::PinSet pins;
    auto cached = (*store)->Lookup("llama-8b", chain, &pins);
    Check(cached.status(), "look up the chain");
    std::vector<std::vector<uint8_t>> outs(*cached, std::vector<uint8_t>(kBlock));
    std::vector<cxlrt::kv::GetItem> items;
    for (size_t i = 0; i < *cached; ++i) {
      cxlrt::kv::GetItem item;
      item.key = chain[i];
      item.dst = outs[i].data();
      item.capacity = kBlock;
      items.push_back(item);
    }
    auto sizes = (*store)->BatchGet("llama-8b", items);
    for (size_t i = 0; i < sizes.size(); ++i) {
      Check(sizes[i].status(), "get a block");
      for (uint8_t b : outs[i]) {
        if (*sizes[i] != kBlock || b != static_cast<uint8_t>(i)) {
          Check(absl::DataLossError("a block holds other bytes than were put"), "check");
        }
      }
    }
    (*store)->Release(pins);
    std::printf("decode: %zu of %zu blocks cached, read and checked\n", *cached, chain.size());
    Check((*comm)->Barrier(), "say decode is done");
  }
  Check((*comm)->Destroy(), "leave the communicator");
  return 0;
}
