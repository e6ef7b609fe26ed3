#pragma once
// What a client presents to a komputed daemon: a bearer token, sent as `authorization: Bearer
// <token>` metadata on every call, and TLS (the CA of the daemon's certificate, and a client
// certificate for mTLS). The one place where the kp remote backend and komputectl turn their
// settings and the environment into channels.

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kp::internal::remote {

// The settings given in code (kp::Remote) or on the command line (komputectl). An empty value
// falls back to its environment variable: token → KOMPUTED_TOKEN, token_file →
// KOMPUTED_TOKEN_FILE, tls_ca → KOMPUTED_TLS_CA, tls_cert → KOMPUTED_TLS_CERT, tls_key →
// KOMPUTED_TLS_KEY. The token is, in order: token, the file token_file, $KOMPUTED_TOKEN, the file
// $KOMPUTED_TOKEN_FILE.
struct CredentialSettings {
  struct Value {
    std::string value;
    // How errors name a given value ("--tls_ca", "kp::Remote::tlsCa"); the environment
    // variable's name when the value comes from there.
    std::string name;
  };
  Value token;       // the token's text
  Value token_file;  // a file holding the token; trailing whitespace is trimmed
  Value tls_ca;      // PEM file: the CA of the daemon's certificate; set, the channel uses TLS
  Value tls_cert;    // PEM file: the client certificate (with tls_key; needs tls_ca)
  Value tls_key;     // PEM file: the client certificate's private key
  bool command_line = false;  // komputectl's: hints name its flags
};

// The token of `settings`: the first of the given token, the given file, $KOMPUTED_TOKEN and
// $KOMPUTED_TOKEN_FILE that is set (a file's trailing whitespace trimmed); empty when none is.
// Errors as ClientCredentials::Load's.
absl::StatusOr<std::string> ResolveToken(const CredentialSettings& settings);

// Credentials loaded from their files: immutable, so that every channel of a session (the
// session's and the bulk transfer lanes') presents the same ones; shareable between threads.
class ClientCredentials {
 public:
  // Resolves `settings` against the environment and reads the files. Errors name the setting and
  // the path (never the token): kFailedPrecondition for a file that cannot be read or is not
  // PEM, kInvalidArgument for an incomplete combination (a client certificate without its key,
  // or without a CA).
  static absl::StatusOr<std::shared_ptr<const ClientCredentials>> Load(
      const CredentialSettings& settings);

  // A channel to `address` over TLS or plain text, with the token on every call when one is set.
  // Over TLS the daemon's certificate is checked against `tls_name` where one is given (the DNS
  // name that `address` was resolved from, Endpoint::tls_name), else against `address`'s host.
  std::shared_ptr<grpc::Channel> CreateChannel(const std::string& address,
                                               grpc::ChannelArguments args,
                                               const std::string& tls_name = "") const;

  // The hint for a failed call on a channel made here: CredentialHint's, and what these
  // credentials lack where the connection was closed during the handshake (all that a client
  // sees of a daemon that wants TLS, or a client certificate) or TLS met plain text.
  std::string Hint(grpc::StatusCode code, absl::string_view message) const;

  bool tls() const { return tls_; }

 private:
  ClientCredentials() = default;

  std::shared_ptr<grpc::ChannelCredentials> channel_credentials_;
  bool tls_ = false;
  bool client_certificate_ = false;
  bool command_line_ = false;
  std::string authorization_;  // "Bearer <token>", empty for none
};

// What to set when a call failed for want of credentials, to append to its message: the token
// variables for UNAUTHENTICATED, the token or the client certificate for PERMISSION_DENIED, the
// TLS variables for an UNAVAILABLE that names TLS (a failed handshake). Empty for any other
// status, and when the message already names the variables. `command_line`: komputectl's flags
// are named first.
std::string CredentialHint(grpc::StatusCode code, absl::string_view message, bool command_line);

// FromGrpcStatus(status, what) (without `what` when it is empty), the hint appended (that of
// `credentials` when given, else kp's CredentialHint): the client's translation of a gRPC status.
absl::Status FromGrpcStatusWithHint(const grpc::Status& status, absl::string_view what = "",
                                    const ClientCredentials* credentials = nullptr);

}  // namespace kp::internal::remote
