// pagedattn::nccl from the installed package: the NCCL library loads, and a bad group is an error.
#include <cstdio>
#include <pagedattn/nccl_communicator.hpp>

int main() {
  try {
    pagedattn::make_nccl_group({});
    return 1;  // an empty group must be refused
  } catch (const pagedattn::Error& e) {
    std::printf("refused as expected: %s\n", e.what());
  }
  std::printf("NCCL %s\n", pagedattn::nccl_version().c_str());
  return 0;
}
