// A client that opens a session, takes device memory, runs an evaluation and starts an
// asynchronous one on the Execute stream, prints "ready", and then waits to be killed without
// closing anything.
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
  // A sync eval first: on the same host it opens the session's eval channel and its ring.
  mgr.sequence()->eval<kp::OpTensorSyncDevice>(std::vector<std::shared_ptr<kp::Tensor>>{big});
  seq->evalAsync<kp::OpTensorSyncDevice>(std::vector<std::shared_ptr<kp::Tensor>>{big});
  std::printf("ready\n");
  std::fflush(stdout);
  pause();  // killed here: no CloseSession, no stream shutdown
  return 0;
}
