// A client that a chaos test kills at a random point. It opens a session on the daemon at
// ADDRESS, creates its tensors, algorithm and sequences, prints "ready", and then repeats one
// kind of work until it is killed, printing "begin" before each round and "done" after it (so the
// test can tell whether a kill fell inside a round):
//
//   chaos_client ADDRESS upload MIB      a device tensor of MIB MiB goes up again and again
//                                        (OpTensorSyncDevice: the chunked WriteTensor stream)
//   chaos_client ADDRESS stream UNITS N  two sequences of the slow kernel (support/slow_kernel.h,
//                                        UNITS units over N elements) through evalAsync on the
//                                        Execute stream, both in flight, then evalAwait
//   chaos_client ADDRESS eval UNITS N    the slow kernel through a unary eval
//
// It never closes anything: it is meant to be SIGKILLed. A result that is wrong prints "wrong"
// and exits 3; a kp::Error prints "error CODE MESSAGE" and exits 4.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <kompute/Kompute.hpp>
#include <memory>
#include <string>
#include <vector>

#include "support/slow_kernel.h"

namespace {

namespace ts = komputed::test_support;

void Say(const char* what) {
  std::printf("%s\n", what);
  std::fflush(stdout);
}

// A slow-kernel pipeline: its tensor, and a sequence recording sync up, dispatch, sync back.
struct SlowPipeline {
  std::shared_ptr<kp::TensorT<uint32_t>> tensor;
  std::shared_ptr<kp::Sequence> sequence;
};

SlowPipeline MakeSlow(kp::Manager& mgr, const std::vector<uint32_t>& spirv,
                      const ts::SlowWork& work, uint32_t n) {
  SlowPipeline p;
  p.tensor = mgr.tensorT<uint32_t>(std::vector<uint32_t>(n, 0));
  std::vector<std::shared_ptr<kp::Tensor>> params = {p.tensor};
  auto algo = mgr.algorithm<float, uint32_t>(params, spirv, kp::Workgroup{n, 1, 1}, {},
                                             {work.units, work.reps});
  p.sequence = mgr.sequence();
  p.sequence->record<kp::OpTensorSyncDevice>(params)
      ->record<kp::OpAlgoDispatch>(algo)
      ->record<kp::OpTensorSyncLocal>(params);
  return p;
}

// Fresh input for round `round` (so a stale result cannot pass for a new one).
void Fill(SlowPipeline& p, uint32_t round) {
  uint32_t* v = p.tensor->data();
  for (uint32_t i = 0; i < p.tensor->size(); ++i) v[i] = round * 7919u + i;
}

bool Check(SlowPipeline& p, uint32_t round, const ts::SlowWork& work) {
  const uint32_t last = static_cast<uint32_t>(p.tensor->size()) - 1;
  return p.tensor->data()[0] == ts::Lcg(round * 7919u, work) &&
         p.tensor->data()[last] == ts::Lcg(round * 7919u + last, work);
}

int Run(int argc, char** argv) {
  const std::string address = argc > 1 ? argv[1] : "";
  const std::string mode = argc > 2 ? argv[2] : "";
  if (mode == "upload" && argc == 4) {
    const uint64_t mib = std::strtoull(argv[3], nullptr, 10);
    kp::Manager mgr{address};
    auto big = mgr.tensorT<uint32_t>(static_cast<size_t>(mib << 18));
    auto seq = mgr.sequence();
    seq->record<kp::OpTensorSyncDevice>(std::vector<std::shared_ptr<kp::Tensor>>{big});
    Say("ready");
    for (uint32_t round = 0;; ++round) {
      big->data()[round % big->size()] = round;
      Say("begin");
      seq->eval();
      Say("done");
    }
  }
  if ((mode == "stream" || mode == "eval") && argc == 5) {
    ts::SlowWork work;
    work.units = static_cast<uint32_t>(std::strtoul(argv[3], nullptr, 10));
    const uint32_t n = static_cast<uint32_t>(std::strtoul(argv[4], nullptr, 10));
    const std::vector<uint32_t> spirv = kp::compileSource(ts::kSlowShader);
    kp::Manager mgr{address};
    const int pipelines = mode == "stream" ? 2 : 1;
    std::vector<SlowPipeline> p;
    for (int i = 0; i < pipelines; ++i) p.push_back(MakeSlow(mgr, spirv, work, n));
    Say("ready");
    for (uint32_t round = 0;; ++round) {
      for (int i = 0; i < pipelines; ++i) Fill(p[i], round + i);
      Say("begin");
      if (mode == "stream") {
        for (int i = 0; i < pipelines; ++i) p[i].sequence->evalAsync();
        for (int i = 0; i < pipelines; ++i) p[i].sequence->evalAwait();
      } else {
        p[0].sequence->eval();
      }
      for (int i = 0; i < pipelines; ++i) {
        if (!Check(p[i], round + i, work)) {
          Say("wrong");
          return 3;
        }
      }
      Say("done");
    }
  }
  std::fprintf(stderr,
               "usage: chaos_client ADDRESS upload MIB | ADDRESS stream UNITS N | "
               "ADDRESS eval UNITS N\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Run(argc, argv);
  } catch (const kp::Error& e) {
    std::printf("error %d %s\n", static_cast<int>(e.code()), e.what());
    std::fflush(stdout);
    return 4;
  }
}
