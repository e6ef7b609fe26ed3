#include "support/test_certs.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "support/process.h"

namespace komputed::test_support {
namespace {

// EC keys (fast to make); certificates valid for two days.
constexpr char kScript[] = R"(set -e
cd "$1"
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:prime256v1 -out "$1" 2>/dev/null; }
ca() {
  key "$1.key"
  openssl req -x509 -new -key "$1.key" -out "$1.pem" -days 2 -subj "/CN=$2" 2>/dev/null
}
signed() {  # name, CA, subject CN, extensions
  key "$1.key"
  openssl req -new -key "$1.key" -out "$1.csr" -subj "/CN=$3" 2>/dev/null
  printf '%s\n' "$4" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -out "$1.pem" \
    -days 2 -extfile "$1.ext" 2>/dev/null
}
ca ca komputed-test-ca
ca other-ca komputed-other-ca
signed server ca localhost "subjectAltName=DNS:localhost,IP:127.0.0.1
extendedKeyUsage=serverAuth"
signed client ca ci-runner "subjectAltName=DNS:ci.example.org
extendedKeyUsage=clientAuth"
signed other-client other-ca ci-runner "subjectAltName=DNS:ci.example.org
extendedKeyUsage=clientAuth"
)";

}  // namespace

TestCertificates::TestCertificates() {
  char dir[] = "/tmp/komputed-certs-XXXXXX";
  if (mkdtemp(dir) == nullptr) {
    status_ = absl::InternalError("mkdtemp failed");
    return;
  }
  dir_ = dir;
  std::string out, err;
  const int code = RunProgram({"/bin/sh", "-c", kScript, "certs", dir_}, &out, &err);
  if (code != 0) {
    status_ = absl::InternalError(
        absl::StrCat("openssl could not make the test certificates (exit ", code, "): ", err));
  }
}

TestCertificates::~TestCertificates() {
  if (!dir_.empty()) std::filesystem::remove_all(dir_);
}

std::string TestCertificates::Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace komputed::test_support
