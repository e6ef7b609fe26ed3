#pragma once
// A channel whose every call carries `authorization: Bearer <token>` metadata, as komputed's
// clients send it: for tests that call the daemon as a tenant. Header-only.

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/client_interceptor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace komputed::test_support {

class BearerTokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerTokenInterceptor(std::string value) : value_(std::move(value)) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace("authorization", value_);
    }
    methods->Proceed();
  }

 private:
  std::string value_;
};

class BearerTokenFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenFactory(std::string value) : value_(std::move(value)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new BearerTokenInterceptor(value_);
  }

 private:
  std::string value_;
};

// `authorization` is sent as `value` ("Bearer <token>"; anything else to test malformed ones);
// an empty value sends none.
inline std::shared_ptr<grpc::Channel> AuthorizedChannel(
    const std::string& address, const std::string& value,
    std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials(),
    grpc::ChannelArguments args = {}) {
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
  if (!value.empty()) factories.push_back(std::make_unique<BearerTokenFactory>(value));
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, credentials, args,
                                                                 std::move(factories));
}

inline std::string Bearer(const std::string& token) { return "Bearer " + token; }

}  // namespace komputed::test_support
