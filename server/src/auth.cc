#include "auth.h"

#include <spdlog/spdlog.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "komputed/core/status.h"
#include "komputed/core/thread_name.h"

namespace komputed::server {
namespace {

// Longer authorization metadata is refused before it is hashed.
constexpr size_t kMaxTokenBytes = 4096;

constexpr absl::string_view kHowToPassToken =
    "send the metadata 'authorization: Bearer <token>' (kp and komputectl: set KOMPUTED_TOKEN "
    "or KOMPUTED_TOKEN_FILE; komputectl also takes --token or --token_file)";

absl::string_view View(const grpc::string_ref& s) { return absl::string_view(s.data(), s.size()); }

// The names a verified client certificate gives: its subject CN first, then its SANs.
std::vector<std::string> CertificateNames(const grpc::ServerContextBase& context) {
  std::vector<std::string> names;
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return names;
  for (const char* property : {"x509_common_name", "x509_subject_alternative_name"}) {
    for (const grpc::string_ref& value : auth->FindPropertyValues(property)) {
      names.emplace_back(View(value));
    }
  }
  return names;
}

}  // namespace

Authenticator::Authenticator(const ServerOptions& options, Metrics* metrics)
    : metrics_(metrics),
      defaults_(options.default_quota),
      client_certificates_(!options.tls_client_ca.empty()),
      poll_interval_(options.tenants_poll_interval),
      ledger_(metrics) {
  implicit_ = ledger_.Account(kImplicitTenant, defaults_);
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Create(const ServerOptions& options,
                                                                     Metrics* metrics) {
  std::unique_ptr<Authenticator> auth(new Authenticator(options, metrics));
  if (!options.tenants_file.empty()) {
    KD_ASSIGN_OR_RETURN(auth->registry_,
                        TenantRegistry::Create(options.tenants_file, options.default_quota));
    if (auth->poll_interval_ > absl::ZeroDuration()) {
      auth->watcher_ = std::thread([a = auth.get()] {
        core::NameThisThread("kd-tenants");
        a->Watch();
      });
    }
  }
  return auth;
}

Authenticator::~Authenticator() {
  {
    absl::MutexLock lock(&watch_mu_);
    stopping_ = true;
  }
  if (watcher_.joinable()) watcher_.join();
}

void Authenticator::Watch() {
  while (true) {
    {
      absl::MutexLock lock(&watch_mu_);
      if (watch_mu_.AwaitWithTimeout(absl::Condition(&stopping_), poll_interval_)) return;
    }
    registry_->Poll();  // logs what it did
  }
}

absl::Status Authenticator::Reload() {
  if (registry_ == nullptr) return absl::OkStatus();
  absl::Status s = registry_->Reload();
  if (s.ok()) {
    spdlog::info("tenants file {} read again: {} tenant(s)", registry_->path(),
                 registry_->Names().size());
  } else {
    spdlog::error("tenants file {} was not applied (the tenants in force stay): {}",
                  registry_->path(), std::string(s.message()));
  }
  return s;
}

Caller Authenticator::CallerOf(const Tenant& tenant) const {
  return Caller{ledger_.Account(tenant.name, tenant.quota), tenant.admin};
}

absl::Status Authenticator::Refuse(const grpc::ServerContextBase& context, const char* reason,
                                   absl::string_view message) const {
  if (metrics_ != nullptr) metrics_->auth_failures_total(reason).Increment();
  const absl::Time now = absl::Now();
  uint64_t unlogged = 0;
  {
    absl::MutexLock lock(&log_mu_);
    if (now - last_log_ < absl::Seconds(1)) {
      ++unlogged_;
      return absl::UnauthenticatedError(message);
    }
    last_log_ = now;
    unlogged = std::exchange(unlogged_, 0);
  }
  spdlog::warn("authentication failed ({}) from {}: {}{}", reason, context.peer(),
               std::string(message),
               unlogged == 0 ? std::string()
                             : absl::StrCat(" (and ", unlogged, " more failure(s) not logged)"));
  return absl::UnauthenticatedError(message);
}

absl::StatusOr<Caller> Authenticator::Authenticate(const grpc::ServerContextBase& context) const {
  if (!required()) return Caller{implicit_, /*admin=*/false};

  const auto& metadata = context.client_metadata();
  const auto found = metadata.find("authorization");
  if (found != metadata.end() && registry_ != nullptr) {
    absl::string_view value = View(found->second);
    if (value.size() > kMaxTokenBytes + 7 || !absl::StartsWithIgnoreCase(value, "bearer ")) {
      return Refuse(context, "malformed",
                    absl::StrCat("the authorization metadata is not 'Bearer <token>' (at most ",
                                 kMaxTokenBytes, " bytes): ", kHowToPassToken));
    }
    const absl::string_view token = absl::StripAsciiWhitespace(value.substr(7));
    std::shared_ptr<const Tenant> tenant = registry_->ByToken(token);
    if (tenant == nullptr) {
      return Refuse(context, "unknown_token",
                    "the bearer token is not one of this daemon's tenants' (mistyped, or revoked "
                    "by a change of the tenants file)");
    }
    return CallerOf(*tenant);
  }

  if (client_certificates_) {
    const std::vector<std::string> names = CertificateNames(context);
    if (registry_ == nullptr && !names.empty()) {
      return CallerOf(Tenant{.name = names.front(), .quota = defaults_});
    }
    for (const std::string& name : names) {
      if (std::shared_ptr<const Tenant> tenant = registry_->ByName(name)) return CallerOf(*tenant);
    }
    if (!names.empty()) {
      return Refuse(context, "unknown_certificate",
                    absl::StrCat("the client certificate (", names.front(),
                                 ") names no tenant of this daemon, and no bearer token was "
                                 "sent: ",
                                 kHowToPassToken));
    }
  }
  return Refuse(context, "no_credentials",
                absl::StrCat("this daemon requires a tenant's credentials: ", kHowToPassToken,
                             client_certificates_
                                 ? ", or present a client certificate (KOMPUTED_TLS_CERT and "
                                   "KOMPUTED_TLS_KEY)"
                                 : ""));
}

}  // namespace komputed::server
