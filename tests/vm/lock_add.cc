// VM harness helper (tests/vm/scenario_atomics.sh): `lock add` on one word of
// a device-DAX mapping, to show that a read-modify-write is not atomic across
// hosts on QEMU's CXL window (emulated as MMIO), which is why cxlrt makes no
// cross-host atomic RMW. Usage: lock_add /dev/daxX.Y OFFSET ADDS
//   ADDS > 0: adds 1 that many times with a locked add; ADDS == 0: prints
//   the word; ADDS < 0: stores 0.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: lock_add /dev/daxX.Y OFFSET ADDS\n");
    return 2;
  }
  const uint64_t offset = std::strtoull(argv[2], nullptr, 0);
  const long adds = std::strtol(argv[3], nullptr, 0);
  const uint64_t page = 2u << 20;  // the device's alignment
  int fd = open(argv[1], O_RDWR);
  if (fd < 0) return std::perror(argv[1]), 1;
  void* p = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, offset & ~(page - 1));
  if (p == MAP_FAILED) return std::perror("mmap"), 1;
  auto* word = reinterpret_cast<uint64_t*>(static_cast<char*>(p) + (offset & (page - 1)));
  if (adds < 0) {
    __atomic_store_n(word, 0, __ATOMIC_SEQ_CST);
  } else {
    for (long i = 0; i < adds; ++i) __atomic_fetch_add(word, 1, __ATOMIC_SEQ_CST);
  }
  std::printf("%llu\n", static_cast<unsigned long long>(__atomic_load_n(word, __ATOMIC_SEQ_CST)));
  return 0;
}
