#pragma once
// Tenants: who may use the daemon, how they prove it, and how much each may take.
//
// A tenants file (YAML) lists each tenant with its name, the SHA-256 (hex) of its bearer token
// and/or the certificate names (subject CN or SAN) that identify it under mutual TLS, whether it is
// an admin, and its quotas:
//
//   tenants:
//     - name: alice
//       token_sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
//       quota: {device_memory_bytes: 8589934592, sessions: 4}
//     - name: ops
//       token_sha256: 60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752
//       admin: true
//     - name: ci-runner
//       certificate_names: [ci.example.org]
//
// token_sha256 may also be a list of hashes (at most 8): each token names the tenant.
// A quota a tenant does not set takes the daemon's default (flags); 0 in the file means no limit.

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace komputed::server {

// What one tenant may hold or send at most; 0: no limit.
struct Quota {
  uint64_t device_memory_bytes = 0;   // tensor memory on devices, staging copies included
  uint64_t host_memory_bytes = 0;     // host-visible (pinned) tensor memory
  uint64_t sessions = 0;              // open sessions
  uint64_t objects_per_session = 0;   // tensors + algorithms + sequences in one session
  uint64_t inflight_submissions = 0;  // evaluations submitted and not yet complete
  uint64_t ops_per_sequence = 0;      // operations recorded in one sequence
  uint64_t tensor_bytes = 0;          // the largest tensor
  uint64_t dispatch_invocations = 0;  // workgroups × local size of one dispatch
  uint64_t source_bytes = 0;          // GLSL or SPIR-V of one algorithm
  uint64_t client_name_bytes = 0;     // OpenSession's client_name
  // Milliseconds one submission may run before the watchdog stops it; lowers the daemon's
  // --max_kernel_time, never raises it.
  uint64_t kernel_time_ms = 0;
};

// The quotas by name, in the order above (their names in the tenants file, in errors and in the
// komputed_quota_refusals_total metric).
struct QuotaField {
  absl::string_view name;
  uint64_t Quota::*field;
};
const std::vector<QuotaField>& QuotaFields();

struct Tenant {
  std::string name;
  // SHA-256 of each of its bearer tokens (several while a token is rotated: the new one is added,
  // the clients move, the old one is removed); none for tenants known only by certificate.
  bool has_token = false;
  std::vector<std::array<uint8_t, 32>> token_sha256;
  std::vector<std::string> certificate_names;
  bool admin = false;
  Quota quota;
};

// SHA-256 of `data` (OpenSSL).
std::array<uint8_t, 32> Sha256(absl::string_view data);
std::string HexDigest(const std::array<uint8_t, 32>& digest);

// Parses a tenants file's text. Quotas a tenant does not give are taken from `defaults`.
// INVALID_ARGUMENT naming the tenant and field at fault (malformed YAML, a missing name, a
// duplicate name or token, a token hash that is not 64 hex digits, a tenant with neither token nor
// certificate names, an unknown field).
absl::StatusOr<std::vector<Tenant>> ParseTenants(absl::string_view yaml, const Quota& defaults);

// The daemon's tenants, read from a file and read again when it changes (Poll) or on request
// (Reload, from SIGHUP). A file that fails to read or parse keeps the tenants in force and is
// reported (logged, and by Reload's status). Thread-safe; lookups never block on a reload.
class TenantRegistry {
 public:
  // Reads the file once: its error is the constructor's caller's to report (Create fails).
  static absl::StatusOr<std::unique_ptr<TenantRegistry>> Create(std::string path, Quota defaults);

  // Reads the file again; on error keeps the tenants in force and returns why.
  absl::Status Reload();
  // Reloads when the file's modification time, size or inode changed since the last read (a
  // Kubernetes Secret update replaces the file through a symlink swap). Returns whether it did.
  bool Poll();

  // The tenant whose token this is (compared in constant time over every tenant), or null.
  std::shared_ptr<const Tenant> ByToken(absl::string_view token) const;
  // The tenant whose certificate_names contain `name` (a verified certificate's CN or SAN), or
  // null.
  std::shared_ptr<const Tenant> ByName(absl::string_view name) const;
  // Every tenant's name (bounded label values for metrics).
  std::vector<std::string> Names() const;
  const std::string& path() const { return path_; }
  uint64_t generation() const;  // incremented by each successful read

 private:
  TenantRegistry(std::string path, Quota defaults);
  struct FileStamp {
    int64_t mtime_ns = 0;
    int64_t size = -1;
    uint64_t inode = 0;
    bool operator==(const FileStamp&) const = default;
  };
  struct Set {
    std::vector<std::shared_ptr<const Tenant>> tenants;
    absl::flat_hash_map<std::string, std::shared_ptr<const Tenant>> by_name;  // names and certs
  };
  static FileStamp Stamp(const std::string& path);

  const std::string path_;
  const Quota defaults_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const Set> set_ ABSL_GUARDED_BY(mu_);
  FileStamp stamp_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Mutex reload_mu_;  // one reload at a time
};

}  // namespace komputed::server
