#include "tls.h"

#include <arpa/inet.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <netinet/in.h>
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <spdlog/spdlog.h>

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace komputed::server {
namespace {

absl::StatusOr<std::string> ReadFile(absl::string_view flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in.is_open()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", path, ": cannot be opened"));
  }
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", path, ": cannot be read"));
  }
  return text.str();
}

// Checks that the file holds at least one PEM certificate (or a private key).
absl::Status CheckPem(absl::string_view flag, const std::string& path, bool key) {
  absl::StatusOr<std::string> text = ReadFile(flag, path);
  if (!text.ok()) return text.status();
  BIO* bio = BIO_new_mem_buf(text->data(), static_cast<int>(text->size()));
  if (bio == nullptr) return absl::ResourceExhaustedError("out of memory reading PEM");
  bool ok = false;
  if (key) {
    EVP_PKEY* pkey = PEM_read_bio_PrivateKey(bio, nullptr, nullptr, nullptr);
    ok = pkey != nullptr;
    EVP_PKEY_free(pkey);
  } else {
    X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
    ok = cert != nullptr;
    X509_free(cert);
  }
  BIO_free(bio);
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, "=", path, ": not a PEM ", key ? "private key" : "certificate"));
}

}  // namespace

bool IsLocalAddress(absl::string_view listen) {
  if (absl::StartsWith(listen, "unix:") || absl::StartsWith(listen, "unix-abstract:")) return true;
  const size_t colon = listen.rfind(':');
  absl::string_view host = colon == absl::string_view::npos ? listen : listen.substr(0, colon);
  if (absl::ConsumePrefix(&host, "[")) absl::ConsumeSuffix(&host, "]");
  if (host == "localhost") return true;
  // Only address literals: a name (even "127.x.example.org") may resolve anywhere.
  const std::string literal(host);
  in_addr v4{};
  if (inet_pton(AF_INET, literal.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  return inet_pton(AF_INET6, literal.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const ServerOptions& o) {
  const bool tls = !o.tls_cert.empty() || !o.tls_key.empty();
  if (tls && (o.tls_cert.empty() || o.tls_key.empty())) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key go together: give the certificate chain and its private key");
  }
  if (!o.tls_client_ca.empty() && !tls) {
    return absl::InvalidArgumentError(
        "--tls_client_ca needs TLS: give --tls_cert and --tls_key as well");
  }
  const bool authenticated = !o.tenants_file.empty() || !o.tls_client_ca.empty();
  if (!IsLocalAddress(o.listen) && !authenticated) {
    if (!o.insecure) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--listen=", o.listen,
          " can be reached from other hosts, and nobody would have to authenticate: give "
          "--tenants_file (bearer tokens) or --tls_client_ca (client certificates), or --insecure "
          "to serve anyone who can reach the port"));
    }
    spdlog::warn(
        "komputed listens on {} with --insecure: anyone who can reach the port can use the "
        "devices and every session (give --tenants_file or --tls_client_ca to authenticate)",
        o.listen);
  } else if (!IsLocalAddress(o.listen) && !tls) {
    spdlog::warn(
        "komputed listens on {} without TLS: bearer tokens and tensor data cross the network in "
        "plain text (give --tls_cert and --tls_key)",
        o.listen);
  }
  if (!tls) return grpc::InsecureServerCredentials();

  if (absl::Status s = CheckPem("tls_cert", o.tls_cert, false); !s.ok()) return s;
  if (absl::Status s = CheckPem("tls_key", o.tls_key, true); !s.ok()) return s;
  if (!o.tls_client_ca.empty()) {
    if (absl::Status s = CheckPem("tls_client_ca", o.tls_client_ca, false); !s.ok()) return s;
  }
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      o.tls_key, o.tls_cert, o.tls_client_ca, o.tls_refresh_seconds);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (!o.tls_client_ca.empty()) {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

}  // namespace komputed::server
