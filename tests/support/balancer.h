#pragma once
// Daemons behind an L4 round-robin balancer: haproxy in TCP mode, which spreads connections over
// its servers as kube-proxy does. For the balancer test and the cluster benchmark.
//
// Environment: HAPROXY, the balancer's binary (default /usr/sbin/haproxy, from scripts/setup).

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "support/daemon_process.h"

namespace komputed::test_support {

// The balancer's binary: $HAPROXY, else /usr/sbin/haproxy.
std::string Haproxy();

// `daemons` komputed processes on fixed loopback ports (each advertising its own address when
// `advertise`), and haproxy in front of them on another. The destructor stops haproxy and the
// daemons.
class BalancedDaemons {
 public:
  BalancedDaemons(int daemons, bool advertise);
  ~BalancedDaemons();
  BalancedDaemons(const BalancedDaemons&) = delete;
  BalancedDaemons& operator=(const BalancedDaemons&) = delete;

  // Every daemon started and the balancer accepts connections.
  bool ready() const;
  // The balancer's address (HOST:PORT).
  const std::string& address() const { return address_; }
  // Daemon `i`'s own address, past the balancer.
  const std::string& daemon_address(size_t i) const { return daemons_[i]->address(); }
  size_t daemons() const { return daemons_.size(); }

 private:
  std::vector<std::unique_ptr<DaemonProcess>> daemons_;
  std::string address_;
  std::string folder_;
  pid_t haproxy_ = -1;
  bool ready_ = false;
};

}  // namespace komputed::test_support
