#pragma once
// Certificates made at test time with the openssl command line, in a temporary folder that goes
// with the object: a CA; a server certificate for localhost and 127.0.0.1 signed by it; a client
// certificate (subject CN "ci-runner", SAN DNS "ci.example.org") signed by it; and a second CA
// that signed nothing the daemon trusts, with its own client certificate.

#include <string>

#include "absl/status/status.h"

namespace komputed::test_support {

class TestCertificates {
 public:
  // Runs openssl; status() says whether it worked.
  TestCertificates();
  ~TestCertificates();
  TestCertificates(const TestCertificates&) = delete;
  TestCertificates& operator=(const TestCertificates&) = delete;

  bool ok() const { return status_.ok(); }
  const absl::Status& status() const { return status_; }
  // Paths of the PEM files.
  std::string ca() const { return dir_ + "/ca.pem"; }
  std::string server_cert() const { return dir_ + "/server.pem"; }
  std::string server_key() const { return dir_ + "/server.key"; }
  std::string client_cert() const { return dir_ + "/client.pem"; }
  std::string client_key() const { return dir_ + "/client.key"; }
  std::string other_ca() const { return dir_ + "/other-ca.pem"; }
  std::string other_client_cert() const { return dir_ + "/other-client.pem"; }
  std::string other_client_key() const { return dir_ + "/other-client.key"; }
  const std::string& dir() const { return dir_; }

  // The contents of a file (empty when it cannot be read).
  static std::string Read(const std::string& path);

 private:
  std::string dir_;
  absl::Status status_;
};

}  // namespace komputed::test_support
