#pragma once
// The remote backend: kp on a komputed daemon.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backend.h"
#include "remote/credentials.h"

namespace kp::internal {

struct RemoteOptions {
  std::string address;                   // host:port of a komputed daemon
  uint32_t device_index = 0;             // the daemon's device index
  std::vector<uint32_t> queue_families;  // as Manager's familyQueueIndices
  std::string client_name;
  remote::CredentialSettings credentials;  // the token and TLS files (else the environment's)
};

// The backend that runs everything on a komputed daemon through one session. Records are kept
// locally and sent with the next eval, together with the host data that the sync operations need;
// the reply brings back the data that comes back: one round trip per eval. evalAsync/evalAwait
// go over the session's Execute stream. Close() closes the session; destroying the backend and
// its objects never calls the daemon.
absl::StatusOr<std::shared_ptr<Backend>> CreateRemoteBackend(const RemoteOptions& options);

}  // namespace kp::internal
