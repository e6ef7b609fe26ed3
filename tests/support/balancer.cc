#include "support/balancer.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "support/process.h"

namespace komputed::test_support {

std::string Haproxy() {
  const char* value = std::getenv("HAPROXY");
  return value != nullptr && value[0] != '\0' ? value : "/usr/sbin/haproxy";
}

BalancedDaemons::BalancedDaemons(int daemons, bool advertise) {
  for (int i = 0; i < daemons; ++i) {
    const std::string address = absl::StrCat("127.0.0.1:", FreeLoopbackPort());
    std::vector<std::string> flags = {"--listen=" + address};
    if (advertise) flags.push_back("--advertise_address=" + address);
    daemons_.push_back(std::make_unique<DaemonProcess>(flags));
  }
  const int port = FreeLoopbackPort();
  address_ = absl::StrCat("127.0.0.1:", port);
  char folder[] = "/tmp/komputed-haproxy-XXXXXX";
  if (mkdtemp(folder) == nullptr) return;
  folder_ = folder;
  std::ofstream config(folder_ + "/haproxy.cfg");
  config << "global\n  maxconn 512\n"
         << "defaults\n  mode tcp\n  timeout connect 5s\n  timeout client 600s\n"
         << "  timeout server 600s\n"
         << "frontend komputed\n  bind " << address_ << "\n  default_backend daemons\n"
         << "backend daemons\n  balance roundrobin\n";
  for (size_t i = 0; i < daemons_.size(); ++i) {
    config << "  server d" << i << " " << daemons_[i]->address() << "\n";
  }
  config.close();
  int out = -1;
  haproxy_ = Spawn({Haproxy(), "-db", "-f", folder_ + "/haproxy.cfg"}, &out);
  if (out >= 0) close(out);
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (haproxy_ > 0 && !AcceptsOnLoopback(port) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ready_ = haproxy_ > 0 && AcceptsOnLoopback(port);
}

BalancedDaemons::~BalancedDaemons() {
  if (haproxy_ > 0) {
    kill(haproxy_, SIGTERM);
    if (WaitExit(haproxy_, absl::Seconds(10)) == -1) {
      kill(haproxy_, SIGKILL);
      waitpid(haproxy_, nullptr, 0);
    }
  }
  if (!folder_.empty()) {
    unlink((folder_ + "/haproxy.cfg").c_str());
    rmdir(folder_.c_str());
  }
}

bool BalancedDaemons::ready() const {
  for (const auto& d : daemons_) {
    if (!d->started()) return false;
  }
  return ready_;
}

}  // namespace komputed::test_support
