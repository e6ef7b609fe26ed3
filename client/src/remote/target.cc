#include "remote/target.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace kp::internal::remote {
namespace {

// gRPC's port when a DNS target gives none.
constexpr char kDefaultPort[] = "443";

struct HostPort {
  std::string host;
  std::string port;  // empty when none was given
};

// "host:port", "[v6]:port", "host", "v6" (bare, more than one colon): as gRPC splits them. False
// for an unclosed bracket or text after "]" other than ":port".
bool SplitHostPort(absl::string_view text, HostPort* out) {
  if (absl::StartsWith(text, "[")) {
    const size_t close = text.find(']');
    if (close == absl::string_view::npos) return false;
    out->host = std::string(text.substr(1, close - 1));
    absl::string_view rest = text.substr(close + 1);
    if (rest.empty()) return true;
    if (!absl::ConsumePrefix(&rest, ":")) return false;
    out->port = std::string(rest);
    return true;
  }
  const size_t colons = std::count(text.begin(), text.end(), ':');
  if (colons == 1) {
    const size_t colon = text.find(':');
    out->host = std::string(text.substr(0, colon));
    out->port = std::string(text.substr(colon + 1));
  } else {
    out->host = std::string(text);  // no port, or a bare IPv6 address
  }
  return true;
}

bool IsIpv4(const std::string& host) {
  in_addr a;
  return inet_pton(AF_INET, host.c_str(), &a) == 1;
}

bool IsIpv6(const std::string& host) {
  in6_addr a;
  return inet_pton(AF_INET6, host.c_str(), &a) == 1;
}

bool IsLoopback(const std::string& host) {
  in_addr a4;
  if (inet_pton(AF_INET, host.c_str(), &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
  in6_addr a6;
  return inet_pton(AF_INET6, host.c_str(), &a6) == 1 && IN6_IS_ADDR_LOOPBACK(&a6);
}

bool IsPort(const std::string& port) {
  uint32_t value = 0;
  return !port.empty() && absl::SimpleAtoi(port, &value) && value <= 65535 &&
         std::all_of(port.begin(), port.end(), [](char c) { return absl::ascii_isdigit(c); });
}

std::string JoinHostPort(const std::string& host, const std::string& port) {
  return absl::StrContains(host, ':') ? absl::StrCat("[", host, "]:", port)
                                      : absl::StrCat(host, ":", port);
}

// The target itself as its only daemon.
Endpoint Whole(absl::string_view target, const HostPort& where) {
  Endpoint e;
  e.target = std::string(target);
  e.host = where.host;
  e.name = where.port.empty() ? std::string(target) : JoinHostPort(where.host, where.port);
  return e;
}

// An `ipv4:` or `ipv6:` list.
absl::StatusOr<std::vector<Endpoint>> AddressList(absl::string_view target, absl::string_view list,
                                                  bool v6) {
  const absl::string_view family = v6 ? "ipv6" : "ipv4";
  absl::ConsumePrefix(&list, "//");  // ipv4:///A:P: gRPC takes the path after the slashes too
  absl::ConsumePrefix(&list, "/");
  std::vector<Endpoint> out;
  for (absl::string_view entry : absl::StrSplit(list, ',')) {
    HostPort hp;
    const bool bracketed = absl::StartsWith(entry, "[");
    if (!SplitHostPort(entry, &hp) || !IsPort(hp.port) || (v6 && !bracketed) ||
        !(v6 ? IsIpv6(hp.host) : IsIpv4(hp.host))) {
      return absl::InvalidArgumentError(
          absl::StrCat("the target '", target, "' lists '", entry, "', which is not an ", family,
                       " address with a port (", v6 ? "[fd00::5]:50051" : "10.0.0.5:50051", ")"));
    }
    Endpoint e;
    e.host = hp.host;
    e.name = JoinHostPort(hp.host, hp.port);
    e.target = e.name;
    if (std::find(out.begin(), out.end(), e) == out.end()) out.push_back(std::move(e));
  }
  if (out.size() == 1) out[0].target = std::string(target);
  return out;
}

// A DNS name with an optional port: each address it resolves to.
std::vector<Endpoint> Name(absl::string_view target, absl::string_view host_port,
                           const HostLookup& lookup) {
  HostPort hp;
  if (!SplitHostPort(host_port, &hp) || hp.host.empty() || IsIpv4(hp.host) || IsIpv6(hp.host)) {
    return {Whole(target, hp)};
  }
  absl::StatusOr<std::vector<std::string>> addresses = lookup(hp.host);
  if (!addresses.ok() || addresses->empty()) return {Whole(target, hp)};
  std::vector<std::string> unique;
  for (const std::string& a : *addresses) {
    if (std::find(unique.begin(), unique.end(), a) == unique.end()) unique.push_back(a);
  }
  if (unique.size() == 1 || std::all_of(unique.begin(), unique.end(), IsLoopback)) {
    return {Whole(target, hp)};
  }
  const std::string port = hp.port.empty() ? kDefaultPort : hp.port;
  std::vector<Endpoint> out;
  for (const std::string& a : unique) {
    Endpoint e;
    e.host = a;
    e.name = JoinHostPort(a, port);
    e.target = e.name;
    e.tls_name = hp.host;
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> LookUpHost(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_ADDRCONFIG;
  addrinfo* result = nullptr;
  const int error = getaddrinfo(host.c_str(), nullptr, &hints, &result);
  if (error != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve '", host, "': ", gai_strerror(error)));
  }
  std::vector<std::string> out;
  for (const addrinfo* a = result; a != nullptr; a = a->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    const void* raw = nullptr;
    if (a->ai_family == AF_INET) {
      raw = &reinterpret_cast<const sockaddr_in*>(a->ai_addr)->sin_addr;
    } else if (a->ai_family == AF_INET6) {
      raw = &reinterpret_cast<const sockaddr_in6*>(a->ai_addr)->sin6_addr;
    }
    if (raw != nullptr && inet_ntop(a->ai_family, raw, text, sizeof(text)) != nullptr) {
      out.emplace_back(text);
    }
  }
  freeaddrinfo(result);
  return out;
}

absl::StatusOr<std::vector<Endpoint>> ResolveTarget(absl::string_view address,
                                                    const HostLookup& lookup) {
  if (address.empty()) return absl::InvalidArgumentError("the daemon's address is empty");
  absl::string_view rest = address;
  if (absl::ConsumePrefix(&rest, "ipv4:")) return AddressList(address, rest, /*v6=*/false);
  if (absl::ConsumePrefix(&rest, "ipv6:")) return AddressList(address, rest, /*v6=*/true);
  if (absl::ConsumePrefix(&rest, "dns:")) {
    if (absl::ConsumePrefix(&rest, "//")) {
      const size_t slash = rest.find('/');
      const absl::string_view authority = rest.substr(0, slash);
      rest = slash == absl::string_view::npos ? absl::string_view() : rest.substr(slash + 1);
      // A DNS server of its own (dns://8.8.8.8/name) is gRPC's to ask, not getaddrinfo's.
      if (!authority.empty()) {
        HostPort hp;
        SplitHostPort(rest, &hp);
        return std::vector<Endpoint>{Whole(address, hp)};
      }
    }
    return Name(address, rest, lookup);
  }
  for (absl::string_view scheme : {"unix:", "unix-abstract:", "vsock:"}) {
    if (absl::StartsWith(address, scheme)) {
      absl::string_view path = address.substr(scheme.size());
      if (scheme == "unix:") absl::ConsumePrefix(&path, "//");
      Endpoint e;
      e.target = e.name = std::string(address);
      e.host = std::string(path);
      return std::vector<Endpoint>{e};
    }
  }
  if (absl::StrContains(address, "://")) {
    Endpoint e;
    e.target = e.name = e.host = std::string(address);
    return std::vector<Endpoint>{e};
  }
  return Name(address, address, lookup);
}

}  // namespace kp::internal::remote
