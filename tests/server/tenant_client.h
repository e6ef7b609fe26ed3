#pragma once
// What the tenant tests share: a tenants file, a client that sends a tenant's token, and calls
// through any client's stubs (each returns the call's status).

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "support/token_channel.h"
#include "tenants.h"
#include "test_util.h"

namespace komputed::server::testing {

// A tenants file in a temporary folder, replaced the way a Kubernetes Secret update does.
class TenantsDir {
 public:
  TenantsDir() {
    char dir[] = "/tmp/komputed-auth-XXXXXX";
    dir_ = mkdtemp(dir);
    path_ = dir_ + "/tenants.yaml";
  }
  ~TenantsDir() { std::filesystem::remove_all(dir_); }
  void Write(const std::string& text) {
    const std::string tmp = path_ + ".new";
    std::ofstream(tmp) << text;
    std::filesystem::rename(tmp, path_);
  }
  const std::string& path() const { return path_; }

 private:
  std::string dir_;
  std::string path_;
};

// A tenants-file entry for `name`, whose token is "token-<name>"; `extra` is more YAML of it
// (indented by four spaces).
inline std::string Entry(const std::string& name, const std::string& extra = "") {
  return absl::StrCat("  - name: ", name,
                      "\n    token_sha256: ", HexDigest(Sha256(absl::StrCat("token-", name))), "\n",
                      extra);
}

inline std::string Token(const std::string& name) { return absl::StrCat("token-", name); }

// The stubs of one tenant (a channel that sends its token).
struct TenantClient : Stubs {
  TenantClient(const std::string& address, const std::string& authorization)
      : Stubs(AuthorizedChannel(address, authorization)) {}
};

inline grpc::Status Open(Stubs& c, std::string* id, const std::string& name = "t") {
  grpc::ClientContext ctx;
  v1::OpenSessionRequest req;
  req.set_client_name(name);
  v1::OpenSessionResponse resp;
  grpc::Status s = c.sessions->OpenSession(&ctx, req, &resp);
  if (id != nullptr) *id = resp.session_id();
  return s;
}
inline grpc::Status KeepAlive(Stubs& c, const std::string& id) {
  grpc::ClientContext ctx;
  v1::KeepAliveRequest req;
  req.set_session_id(id);
  v1::KeepAliveResponse resp;
  return c.sessions->KeepAlive(&ctx, req, &resp);
}
inline grpc::Status Close(Stubs& c, const std::string& id) {
  grpc::ClientContext ctx;
  v1::CloseSessionRequest req;
  req.set_session_id(id);
  v1::CloseSessionResponse resp;
  return c.sessions->CloseSession(&ctx, req, &resp);
}
inline v1::ListSessionsResponse List(Stubs& c, bool include_ids = false) {
  grpc::ClientContext ctx;
  v1::ListSessionsRequest req;
  req.set_include_ids(include_ids);
  v1::ListSessionsResponse resp;
  EXPECT_THAT(c.sessions->ListSessions(&ctx, req, &resp), IsOk());
  return resp;
}
inline grpc::Status DestroyAlgorithm(Stubs& c, const std::string& id, uint64_t handle) {
  grpc::ClientContext ctx;
  v1::DestroyAlgorithmRequest req;
  req.set_session_id(id);
  req.set_handle(handle);
  v1::DestroyAlgorithmResponse resp;
  return c.algorithms->DestroyAlgorithm(&ctx, req, &resp);
}
inline grpc::Status DestroySequence(Stubs& c, const std::string& id, uint64_t handle) {
  grpc::ClientContext ctx;
  v1::DestroySequenceRequest req;
  req.set_session_id(id);
  req.set_handle(handle);
  v1::DestroySequenceResponse resp;
  return c.sequences->DestroySequence(&ctx, req, &resp);
}
// ReadTensor of the whole tensor: its bytes, or the status.
inline grpc::Status ReadTensor(Stubs& c, const std::string& id, uint64_t handle,
                               std::string* bytes) {
  grpc::ClientContext ctx;
  v1::ReadTensorRequest req;
  req.set_session_id(id);
  req.set_handle(handle);
  auto reader = c.tensors->ReadTensor(&ctx, req);
  v1::TensorChunk chunk;
  while (reader->Read(&chunk)) bytes->append(chunk.data());
  return reader->Finish();
}
inline grpc::Status WriteTensor(Stubs& c, const std::string& id, uint64_t handle,
                                const std::string& bytes) {
  grpc::ClientContext ctx;
  v1::WriteTensorResponse resp;
  auto writer = c.tensors->WriteTensor(&ctx, &resp);
  v1::TensorChunk chunk;
  chunk.set_session_id(id);
  chunk.set_handle(handle);
  chunk.set_data(bytes);
  writer->Write(chunk);
  writer->WritesDone();
  return writer->Finish();
}
// One Execute stream with one eval: the event's status code, or the stream's.
inline int Execute(Stubs& c, const v1::EvalRequest& eval) {
  grpc::ClientContext ctx;
  auto stream = c.sequences->Execute(&ctx);
  v1::ExecuteRequest req;
  *req.mutable_eval() = eval;
  stream->Write(req);
  stream->WritesDone();
  v1::ExecuteEvent event;
  const bool got = stream->Read(&event);
  grpc::Status s = stream->Finish();
  return got ? event.code() : s.error_code();
}

}  // namespace komputed::server::testing
