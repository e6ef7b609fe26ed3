#pragma once
// The komputed daemons that a gRPC target names. gRPC resolves a target inside the channel and
// keeps the addresses to itself (Debian's gRPC 1.51 has no public resolver API), so a client that
// must choose among the daemons, or list them all, resolves the target here: `ipv4:` and `ipv6:`
// lists are read as written, DNS names (`dns:///host:port`, plain `host:port`) are looked up with
// getaddrinfo, and everything else is one daemon.

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kp::internal::remote {

// One daemon of a target.
struct Endpoint {
  // What a channel dials: the target as given when it names one daemon (so that its connection
  // is made exactly as gRPC makes it from the whole target), else "IP:PORT" ("[IPv6]:PORT").
  std::string target;
  // How messages, KOMPUTED_DEVICE and the `address=` selector name it: "10.0.0.5:50051",
  // "[fd00::5]:50051"; for a target that names one daemon, its host:port (or the target itself
  // where it has none: "unix:/run/komputed.sock").
  std::string name;
  // The host alone (the `node=` selector): "10.0.0.5", "fd00::5", "gpu1.example.org"; for a Unix
  // socket its path.
  std::string host;
  // Over TLS, the name that the daemon's certificate is checked against when `target` is an
  // address that a DNS name resolved to: that name. Empty: the target's own host.
  std::string tls_name;

  bool operator==(const Endpoint&) const = default;
};

// Looks up a DNS name: its addresses as numeric strings ("10.0.0.5", "fd00::5"), in the order to
// try them. The default is getaddrinfo.
using HostLookup = std::function<absl::StatusOr<std::vector<std::string>>(const std::string& host)>;
absl::StatusOr<std::vector<std::string>> LookUpHost(const std::string& host);

// The daemons that `address` names, in order, without duplicates:
//   ipv4:A:P[,B:P...], ipv6:[A]:P[,...]  each address, as written (a port is required)
//   dns:///host[:port], dns:host[:port], host[:port]
//                                        each address the name resolves to; one daemon (the
//                                        target itself) when it resolves to a single address, to
//                                        loopback addresses only (this host: ::1 and 127.0.0.1
//                                        are one daemon), or not at all (gRPC then reports the
//                                        failure as it always has). The port defaults to 443, as
//                                        in gRPC.
//   an IP literal (10.0.0.5:50051, [::1]:50051), unix:, unix-abstract:, vsock:, dns://SERVER/...,
//   any other scheme://...               one daemon: the target itself
// kInvalidArgument, naming the target and the part that is wrong, for an empty target and an
// `ipv4:`/`ipv6:` list with an entry that is not an address of that family with a port.
absl::StatusOr<std::vector<Endpoint>> ResolveTarget(absl::string_view address,
                                                    const HostLookup& lookup = LookUpHost);

}  // namespace kp::internal::remote
