// komputed_cluster_bench: what several daemons cost a client, as ratios in one run.
//
// - Placement: how long `kp::Manager(remote)` takes to open its session when the address names 1,
//   3 and 8 komputed daemons on loopback (an ipv4: list; with one daemon there is no ListDevices
//   call). The managers' sessions are closed between placements, so every daemon stays empty and
//   each placement asks every daemon.
// - Balancer: a 256 MiB round trip (sync to the device and back, 4 transfer lanes) through haproxy
//   in TCP round-robin mode in front of two daemons, against the same to a daemon directly; with
//   the daemons advertising their own addresses (the transfer lanes go around the balancer) and
//   without (everything goes through it). Direct and balanced round trips alternate, each round
//   starting with the other one.
//
// Exits 1 when a placement or a round trip fails or a round trip's data comes back wrong.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <kompute/Kompute.hpp>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench_common.h"
#include "support/balancer.h"
#include "support/daemon_process.h"

ABSL_FLAG(int, placements, 20, "timed placements for each number of daemons (after 2 untimed)");
ABSL_FLAG(int, rounds, 3, "timed 256 MiB round trips for each path (after 1 untimed)");
ABSL_FLAG(int, transfer_streams, 4, "KOMPUTED_TRANSFER_STREAMS for the round trips");

namespace komputed_bench {
namespace {

using komputed::test_support::BalancedDaemons;
using komputed::test_support::DaemonProcess;

struct Stats {
  absl::Duration p50, p90;
};

Stats Summarize(std::vector<absl::Duration> samples) {
  std::sort(samples.begin(), samples.end());
  return Stats{Quantile(samples, 0.5), Quantile(samples, 0.9)};
}

double Micros(absl::Duration d) { return absl::ToDoubleMicroseconds(d); }

// The median time to construct a kp::Manager on `address`.
absl::Duration Place(const std::string& address, int timed) {
  kp::Remote remote;
  remote.address = address;
  std::vector<absl::Duration> samples;
  for (int i = -2; i < timed; ++i) {
    const absl::Time start = absl::Now();
    auto mgr = std::make_unique<kp::Manager>(remote);
    const absl::Duration took = absl::Now() - start;
    if (i >= 0) samples.push_back(took);
  }
  const Stats s = Summarize(samples);
  std::printf("  %-40.40s p50 %8.0f us  p90 %8.0f us\n", address.c_str(), Micros(s.p50),
              Micros(s.p90));
  return s.p50;
}

int RunPlacement() {
  constexpr int kMost = 8;
  std::vector<std::unique_ptr<DaemonProcess>> daemons;
  for (int i = 0; i < kMost; ++i) {
    daemons.push_back(std::make_unique<DaemonProcess>());
    if (!daemons.back()->started()) {
      std::fprintf(stderr, "daemon %d did not start\n", i);
      return 1;
    }
  }
  auto target = [&](int n) {
    if (n == 1) return daemons[0]->address();
    std::vector<std::string> addresses;
    for (int i = 0; i < n; ++i) addresses.push_back(daemons[i]->address());
    return absl::StrCat("ipv4:", absl::StrJoin(addresses, ","));
  };
  std::printf("placement: kp::Manager(remote) until its session is open\n");
  const int timed = absl::GetFlag(FLAGS_placements);
  const absl::Duration one = Place(target(1), timed);
  const absl::Duration three = Place(target(3), timed);
  const absl::Duration eight = Place(target(8), timed);
  std::printf("ratio placement 3 daemons / 1 daemon: %.2f\n", absl::FDivDuration(three, one));
  std::printf("ratio placement 8 daemons / 1 daemon: %.2f\n", absl::FDivDuration(eight, one));
  return 0;
}

// One 256 MiB round trip: its time; throws when the data comes back wrong.
absl::Duration RoundTrip(kp::Sequence& seq, kp::TensorT<float>& tensor,
                         const std::vector<float>& data) {
  std::copy(data.begin(), data.end(), tensor.data());
  const absl::Time start = absl::Now();
  seq.eval();
  const absl::Duration took = absl::Now() - start;
  if (!MatchesPattern(tensor.data(), kBulkCount)) throw std::runtime_error("data came back wrong");
  return took;
}

struct Path {
  std::string name;
  std::unique_ptr<kp::Manager> mgr;
  std::shared_ptr<kp::TensorT<float>> tensor;
  std::shared_ptr<kp::Sequence> seq;
  std::vector<absl::Duration> samples;
};

Path Open(const std::string& name, const std::string& address, const std::vector<float>& data) {
  Path p;
  p.name = name;
  p.mgr = std::make_unique<kp::Manager>(kp::Remote{address, 0, {}});
  p.tensor = p.mgr->tensorT<float>(data);
  const std::vector<std::shared_ptr<kp::Tensor>> params = {p.tensor};
  p.seq = p.mgr->sequence();
  p.seq->record<kp::OpTensorSyncDevice>(params)->record<kp::OpTensorSyncLocal>(params);
  return p;
}

int RunBalancer() {
  const std::string lanes = absl::StrCat(absl::GetFlag(FLAGS_transfer_streams));
  setenv("KOMPUTED_TRANSFER_STREAMS", lanes.c_str(), 1);
  const std::vector<float> data = PatternVector(kBulkCount);
  std::printf("balancer: 256 MiB up and down, %s transfer lanes (p50 of %d)\n", lanes.c_str(),
              absl::GetFlag(FLAGS_rounds));
  for (const bool advertise : {true, false}) {
    BalancedDaemons balanced(2, advertise);
    if (!balanced.ready()) {
      std::fprintf(stderr, "the daemons or %s did not start\n",
                   komputed::test_support::Haproxy().c_str());
      return 1;
    }
    std::vector<Path> paths;
    paths.push_back(Open("direct", balanced.daemon_address(0), data));
    paths.push_back(Open(advertise ? "balancer, daemons advertise their addresses"
                                   : "balancer, everything through it",
                         balanced.address(), data));
    // Each round starts with the next path, so that neither always follows the other.
    for (int round = -1; round < absl::GetFlag(FLAGS_rounds); ++round) {
      for (size_t k = 0; k < paths.size(); ++k) {
        Path& p = paths[(k + round + 1) % paths.size()];
        const absl::Duration took = RoundTrip(*p.seq, *p.tensor, data);
        if (round >= 0) p.samples.push_back(took);
      }
    }
    std::vector<double> gbps;
    for (const Path& p : paths) {
      const absl::Duration p50 = Summarize(p.samples).p50;
      gbps.push_back(2.0 * kBulkBytes / absl::ToDoubleSeconds(p50) / 1e9);
      std::printf("  %-45s %7.1f ms  %6.2f GB/s\n", p.name.c_str(), absl::ToDoubleMilliseconds(p50),
                  gbps.back());
    }
    std::printf("ratio balancer/direct (%s): %.2f\n",
                advertise ? "advertised addresses" : "no advertised addresses", gbps[1] / gbps[0]);
  }
  return 0;
}

}  // namespace
}  // namespace komputed_bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "The time to place a session over 1, 3 and 8 daemons, and 256 MiB through a balancer "
      "against direct.");
  absl::ParseCommandLine(argc, argv);
  try {
    if (int rc = komputed_bench::RunPlacement(); rc != 0) return rc;
    return komputed_bench::RunBalancer();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "komputed_cluster_bench: %s\n", e.what());
    return 1;
  }
}
