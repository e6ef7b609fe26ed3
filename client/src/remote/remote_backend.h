#pragma once
// The remote backend: kp on a komputed daemon.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backend.h"
#include "remote/credentials.h"

namespace kp::internal {

struct RemoteOptions {
  // A gRPC target naming one komputed daemon (host:port, unix:PATH) or several (ipv4:A,B,
  // dns:///NAME:PORT): see remote/placement.h for how one of their devices is chosen.
  std::string address;
  std::string address_origin;  // how messages name it ("KOMPUTED_ADDRESS"); empty: the value
  // The daemon's device index. Unset: device 0 of a single daemon; with several daemons (or a
  // `name` selector) the device with the most free memory.
  std::optional<uint32_t> device_index;
  // "HOST:PORT": the daemon (of several) that KOMPUTED_DEVICE=HOST:PORT/N names; empty: any.
  std::string device_daemon;
  // A selector (remote/placement.h: name~H200,node=10.0.0.5), named `select_origin` in messages.
  std::string select;
  std::string select_origin = "KOMPUTED_SELECT";
  std::vector<uint32_t> queue_families;  // as Manager's familyQueueIndices
  std::string client_name;
  remote::CredentialSettings credentials;  // the token and TLS files (else the environment's)
  // Over TLS, the name that the daemon's certificate is checked against when `address` is one
  // that a DNS name resolved to (set by placement); empty: the address's own host.
  std::string tls_name;
};

// The backend that runs everything on a komputed daemon through one session, opened on the device
// that placement chooses among the daemons of `options.address` (remote/placement.h; no call for
// a single daemon unless a `name` selector needs its device list). Records are kept
// locally and sent with the next eval, together with the host data that the sync operations need;
// the reply brings back the data that comes back: one round trip per eval. evalAsync/evalAwait
// go over the session's Execute stream. Close() closes the session; destroying the backend and
// its objects never calls the daemon.
absl::StatusOr<std::shared_ptr<Backend>> CreateRemoteBackend(const RemoteOptions& options);

// Compiles a GLSL compute shader on the komputed daemon at `address` (any one daemon of several),
// with `credentials` (else the environment's); no session is opened. The daemon's errors as they
// come (INVALID_ARGUMENT with the compiler's messages), bounded by the RPC timeout.
absl::StatusOr<std::vector<uint32_t>> CompileGlslRemotely(
    const std::string& address, const remote::CredentialSettings& credentials,
    const std::string& source);

}  // namespace kp::internal
