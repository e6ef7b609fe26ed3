#pragma once
// Who is calling: every komputed.v1 call is authenticated before it touches a session.
//
//  - With a tenants file, a call carries `authorization: Bearer <token>` metadata, whose token
//    names its tenant (TenantRegistry::ByToken, constant time). With mutual TLS as well, a call
//    without a token may be named by its verified client certificate (the subject CN or a SAN,
//    matched against the tenants' names and certificate_names).
//  - With mutual TLS and no tenants file, the verified certificate's CN (or first SAN) is the
//    tenant, with the default quotas.
//  - With neither, every caller is the one implicit tenant "default" (what a daemon on loopback
//    serves), with the default quotas.
//
// Refusals are UNAUTHENTICATED with a message that says how to pass a credential; the token is
// never logged. Each refusal is counted (komputed_auth_failures_total) and logged with the peer
// and the reason, at most one line a second (the rest are counted in the next line).

#include <grpcpp/server_context.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "metrics.h"
#include "quota.h"
#include "server_options.h"
#include "tenants.h"

namespace komputed::server {

// The tenant of one call.
struct Caller {
  std::shared_ptr<TenantAccount> account;  // never null
  bool admin = false;
  const std::string& tenant() const { return account->tenant(); }
};

class Authenticator {
 public:
  static constexpr const char* kImplicitTenant = "default";

  // Reads the tenants file (when options.tenants_file is set; its errors fail Create) and watches
  // it for changes every options.tenants_poll_interval.
  static absl::StatusOr<std::unique_ptr<Authenticator>> Create(const ServerOptions& options,
                                                               Metrics* metrics);
  ~Authenticator();
  Authenticator(const Authenticator&) = delete;
  Authenticator& operator=(const Authenticator&) = delete;

  absl::StatusOr<Caller> Authenticate(const grpc::ServerContextBase& context) const;

  // Reads the tenants file again (SIGHUP); on error the tenants in force stay. OK without a file.
  absl::Status Reload();
  // Whether callers must prove who they are (a tenants file or client certificates).
  bool required() const { return registry_ != nullptr || client_certificates_; }
  // The tenants in force; null without a tenants file.
  const TenantRegistry* registry() const { return registry_.get(); }

 private:
  Authenticator(const ServerOptions& options, Metrics* metrics);
  absl::Status Refuse(const grpc::ServerContextBase& context, const char* reason,
                      absl::string_view message) const;
  Caller CallerOf(const Tenant& tenant) const;
  void Watch();

  Metrics* const metrics_;
  const Quota defaults_;
  const bool client_certificates_;
  const absl::Duration poll_interval_;
  std::unique_ptr<TenantRegistry> registry_;
  mutable TenantLedger ledger_;
  std::shared_ptr<TenantAccount> implicit_;

  mutable absl::Mutex log_mu_;
  mutable absl::Time last_log_ ABSL_GUARDED_BY(log_mu_) = absl::InfinitePast();
  mutable uint64_t unlogged_ ABSL_GUARDED_BY(log_mu_) = 0;

  absl::Mutex watch_mu_;
  bool stopping_ ABSL_GUARDED_BY(watch_mu_) = false;
  std::thread watcher_;
};

}  // namespace komputed::server
