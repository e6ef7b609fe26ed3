#pragma once
// The daemon's transport security: plain TCP, TLS, or mutual TLS, from the options' PEM files
// (re-read when they change, so that a rotated certificate takes effect without a restart), and
// the rule that a daemon reachable from the network must authenticate its callers.

#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server_options.h"

namespace komputed::server {

// Whether `listen` (host:port, unix:PATH, unix-abstract:NAME) can only be reached from this host:
// a Unix socket, localhost, 127.0.0.0/8 or ::1.
bool IsLocalAddress(absl::string_view listen);

// The credentials to listen with. INVALID_ARGUMENT, naming the flag and the file, for a
// certificate or key that is missing, unreadable or not PEM, for tls_cert without tls_key (or the
// reverse), and for tls_client_ca without tls_cert. FAILED_PRECONDITION for an address off this
// host without tenants or client certificates, unless options.insecure.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const ServerOptions& options);

}  // namespace komputed::server
