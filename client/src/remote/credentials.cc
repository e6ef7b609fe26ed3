#include "remote/credentials.h"

#include <grpc/grpc.h>
#include <grpcpp/support/client_interceptor.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "komputed/core/status.h"
#include "komputed/v1/grpc_status.h"

namespace kp::internal::remote {
namespace {

using Value = CredentialSettings::Value;

// `given` when it holds a value, else the environment variable `env` under its own name.
Value OrEnvironment(const Value& given, const char* env) {
  if (!given.value.empty()) return given;
  const char* value = std::getenv(env);
  return Value{value != nullptr ? value : "", env};
}

// The whole file `path`, which the setting `name` names.
absl::StatusOr<std::string> ReadFile(const std::string& name, const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, ": cannot read ", path, ": ", std::strerror(errno)));
  }
  std::string text;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), f)) > 0) text.append(buffer, n);
  const bool failed = std::ferror(f) != 0;
  const int error = errno;
  std::fclose(f);
  if (failed) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, ": cannot read ", path, ": ", std::strerror(error)));
  }
  return text;
}

// A PEM file: gRPC would only fail at the first connection (or give up on the channel) with a
// message that names neither the setting nor the file.
absl::StatusOr<std::string> ReadPem(const Value& setting) {
  absl::StatusOr<std::string> text = ReadFile(setting.name, setting.value);
  if (text.ok() && !absl::StrContains(*text, "-----BEGIN ")) {
    return absl::FailedPreconditionError(absl::StrCat(
        setting.name, ": ", setting.value, " is not a PEM file (no \"-----BEGIN\" line)"));
  }
  return text;
}

// The token of `source` (its text, read from a file where it names one): gRPC metadata values
// are printable ASCII. The message never holds the token.
absl::Status CheckToken(const std::string& source, absl::string_view token) {
  for (char c : token) {
    if (c < 0x20 || c > 0x7e) {
      return absl::InvalidArgumentError(
          absl::StrCat(source,
                       ": the token holds a character other than printable ASCII "
                       "(it cannot go in gRPC metadata)"));
    }
  }
  return absl::OkStatus();
}

// The token of the file that `setting` names.
absl::StatusOr<std::string> ReadToken(const Value& setting) {
  absl::StatusOr<std::string> text = ReadFile(setting.name, setting.value);
  if (!text.ok()) return text.status();
  // Files usually end with a newline, which is not the token's.
  std::string token(absl::StripTrailingAsciiWhitespace(*text));
  if (token.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(setting.name, ": ", setting.value, " holds no token (it is empty)"));
  }
  KD_RETURN_IF_ERROR(CheckToken(setting.name, token));
  return token;
}

// Adds `authorization: Bearer <token>` to every call of the channel that it was made for.
class BearerInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerInterceptor(const std::string* authorization) : authorization_(authorization) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace("authorization", *authorization_);
    }
    methods->Proceed();
  }

 private:
  const std::string* authorization_;  // the credentials', which the factory keeps alive
};

// Owned by the channel; keeps the credentials that its interceptors read alive.
class BearerInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerInterceptorFactory(std::shared_ptr<const std::string> authorization)
      : authorization_(std::move(authorization)) {}

  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new BearerInterceptor(authorization_.get());
  }

 private:
  std::shared_ptr<const std::string> authorization_;
};

// Whether a gRPC message is about TLS: a failed handshake, a certificate not verified.
bool NamesTls(absl::string_view message) {
  const std::string lower = absl::AsciiStrToLower(message);
  for (const char* word : {"ssl", "tls", "handshake", "certificate"}) {
    if (absl::StrContains(lower, word)) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<std::string> ResolveToken(const CredentialSettings& settings) {
  if (!settings.token.value.empty()) {
    KD_RETURN_IF_ERROR(CheckToken(settings.token.name, settings.token.value));
    return settings.token.value;
  }
  if (!settings.token_file.value.empty()) return ReadToken(settings.token_file);
  const Value env = OrEnvironment(Value{}, "KOMPUTED_TOKEN");
  if (!env.value.empty()) {
    KD_RETURN_IF_ERROR(CheckToken(env.name, env.value));
    return env.value;
  }
  const Value file = OrEnvironment(Value{}, "KOMPUTED_TOKEN_FILE");
  if (file.value.empty()) return std::string();
  return ReadToken(file);
}

absl::StatusOr<std::shared_ptr<const ClientCredentials>> ClientCredentials::Load(
    const CredentialSettings& settings) {
  std::shared_ptr<ClientCredentials> c(new ClientCredentials());
  c->command_line_ = settings.command_line;

  KD_ASSIGN_OR_RETURN(const std::string token, ResolveToken(settings));
  if (!token.empty()) c->authorization_ = absl::StrCat("Bearer ", token);

  const Value ca = OrEnvironment(settings.tls_ca, "KOMPUTED_TLS_CA");
  const Value cert = OrEnvironment(settings.tls_cert, "KOMPUTED_TLS_CERT");
  const Value key = OrEnvironment(settings.tls_key, "KOMPUTED_TLS_KEY");
  if (cert.value.empty() != key.value.empty()) {
    // The missing one under both of its names: the given one's kind and the variable.
    auto names = [](const Value& given, const char* env) {
      return given.name.empty() || given.name == env ? std::string(env)
                                                     : absl::StrCat(given.name, " or ", env);
    };
    const bool no_key = key.value.empty();
    return absl::InvalidArgumentError(absl::StrCat(
        no_key ? cert.name : key.name, " is set but ",
        no_key ? names(settings.tls_key, "KOMPUTED_TLS_KEY")
               : names(settings.tls_cert, "KOMPUTED_TLS_CERT"),
        " is not: a client certificate needs both KOMPUTED_TLS_CERT (the certificate) and "
        "KOMPUTED_TLS_KEY (its private key)"));
  }
  if (!cert.value.empty() && ca.value.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(cert.name,
                     " is set without KOMPUTED_TLS_CA: a client certificate is presented over TLS, "
                     "which KOMPUTED_TLS_CA (the CA of the daemon's certificate) turns on"));
  }
  if (ca.value.empty()) {
    c->channel_credentials_ = grpc::InsecureChannelCredentials();
    return c;
  }
  grpc::SslCredentialsOptions ssl;
  KD_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadPem(ca));
  if (!cert.value.empty()) {
    KD_ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadPem(cert));
    KD_ASSIGN_OR_RETURN(ssl.pem_private_key, ReadPem(key));
    c->client_certificate_ = true;
  }
  c->channel_credentials_ = grpc::SslCredentials(ssl);
  if (c->channel_credentials_ == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("gRPC refused the TLS credentials of ", ca.name, " (", ca.value, ")"));
  }
  c->tls_ = true;
  return c;
}

std::shared_ptr<grpc::Channel> ClientCredentials::CreateChannel(const std::string& address,
                                                                grpc::ChannelArguments args,
                                                                const std::string& tls_name) const {
  // gRPC shuts its library down when the last of its objects goes, and that shutdown waits for
  // its executor threads (up to 10 s, in the destructor of a Manager's last channel). The library
  // keeps gRPC initialized for the rest of the process instead.
  static const bool kGrpcKept = (grpc_init(), true);
  (void)kGrpcKept;
  if (tls_ && !tls_name.empty()) args.SetSslTargetNameOverride(tls_name);
  if (authorization_.empty()) {
    return grpc::CreateCustomChannel(address, channel_credentials_, args);
  }
  // An interceptor, not call credentials: gRPC sends call credentials over TLS only, and a
  // daemon on loopback may take tokens over plain text.
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
  factories.push_back(std::make_unique<BearerInterceptorFactory>(
      std::make_shared<const std::string>(authorization_)));
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, channel_credentials_,
                                                                 args, std::move(factories));
}

std::string CredentialHint(grpc::StatusCode code, absl::string_view message, bool command_line) {
  switch (code) {
    case grpc::StatusCode::UNAUTHENTICATED:
      if (absl::StrContains(message, "KOMPUTED_TOKEN")) return "";
      return command_line ? "pass the daemon's token with --token or --token_file (or set "
                            "KOMPUTED_TOKEN or KOMPUTED_TOKEN_FILE)"
                          : "set KOMPUTED_TOKEN (the daemon's token) or KOMPUTED_TOKEN_FILE (a "
                            "file holding it)";
    case grpc::StatusCode::PERMISSION_DENIED:
      if (absl::StrContains(message, "KOMPUTED_")) return "";
      return command_line ? "the token (--token, --token_file) or client certificate (--tls_cert) "
                            "does not allow this"
                          : "the token (KOMPUTED_TOKEN, KOMPUTED_TOKEN_FILE) or client "
                            "certificate (KOMPUTED_TLS_CERT) does not allow this";
    case grpc::StatusCode::UNAVAILABLE:
      if (!NamesTls(message) || absl::StrContains(message, "KOMPUTED_TLS")) return "";
      return command_line
                 ? "TLS failed: check --tls_ca (the CA of the daemon's certificate) and, where "
                   "the daemon requires client certificates, --tls_cert and --tls_key"
                 : "TLS failed: check KOMPUTED_TLS_CA (the CA of the daemon's certificate) and, "
                   "where the daemon requires client certificates, KOMPUTED_TLS_CERT and "
                   "KOMPUTED_TLS_KEY";
    default:
      return "";
  }
}

std::string ClientCredentials::Hint(grpc::StatusCode code, absl::string_view message) const {
  if (code == grpc::StatusCode::UNAVAILABLE && absl::StrContains(message, "Socket closed") &&
      !absl::StrContains(message, "KOMPUTED_TLS")) {
    if (!tls_) {
      return command_line_ ? "if the daemon serves TLS, pass --tls_ca (the CA of its certificate)"
                           : "if the daemon serves TLS, set KOMPUTED_TLS_CA (the CA of its "
                             "certificate)";
    }
    if (!client_certificate_) {
      return command_line_ ? "if the daemon requires a client certificate, pass --tls_cert and "
                             "--tls_key"
                           : "if the daemon requires a client certificate, set KOMPUTED_TLS_CERT "
                             "and KOMPUTED_TLS_KEY";
    }
    return command_line_ ? "the daemon may have refused the client certificate (--tls_cert)"
                         : "the daemon may have refused the client certificate "
                           "(KOMPUTED_TLS_CERT)";
  }
  if (code == grpc::StatusCode::UNAVAILABLE && tls_ &&
      absl::StrContains(message, "wrong version number")) {
    return command_line_ ? "the daemon does not serve TLS there: drop --tls_ca (and "
                           "KOMPUTED_TLS_CA), or check the address"
                         : "the daemon does not serve TLS there: unset KOMPUTED_TLS_CA, or check "
                           "the address";
  }
  return CredentialHint(code, message, command_line_);
}

absl::Status FromGrpcStatusWithHint(const grpc::Status& status, absl::string_view what,
                                    const ClientCredentials* credentials) {
  absl::Status s = what.empty() ? komputed::v1::wire::FromGrpcStatus(status)
                                : komputed::v1::wire::FromGrpcStatus(status, what);
  const std::string hint =
      credentials != nullptr
          ? credentials->Hint(status.error_code(), status.error_message())
          : CredentialHint(status.error_code(), status.error_message(), /*command_line=*/false);
  if (hint.empty()) return s;
  return absl::Status(s.code(), absl::StrCat(s.message(), " (", hint, ")"));
}

}  // namespace kp::internal::remote
