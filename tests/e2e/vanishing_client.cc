// A client that opens a session, takes device memory, starts an asynchronous evaluation on the
// Execute stream, prints "ready", and then waits to be killed without closing anything.
#include <unistd.h>

#include <cstdio>
#include <kompute/Kompute.hpp>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: vanishing_client ADDRESS\n");
    return 2;
  }
  kp::Manager mgr{std::string(argv[1])};
  auto big = mgr.tensorT<float>(size_t{4} << 20);  // 16 MiB
  auto seq = mgr.sequence();
  seq->evalAsync<kp::OpTensorSyncDevice>(std::vector<std::shared_ptr<kp::Tensor>>{big});
  std::printf("ready\n");
  std::fflush(stdout);
  pause();  // killed here: no CloseSession, no stream shutdown
  return 0;
}
