// Server reflection (grpc.reflection.v1alpha) as the daemon serves it: several requests on one
// stream, each answered in turn, files sent with their dependencies once per stream, and errors
// that name what was not found.
#include <google/protobuf/descriptor.pb.h>

#include <chrono>
#include <set>
#include <string>

#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "test_util.h"

namespace komputed::server::testing {
namespace {

namespace rf = grpc::reflection::v1alpha;

class ReflectionTest : public ServerTest {
 protected:
  // Sends every request on one stream, then half-closes: the responses in order, and the status.
  std::vector<rf::ServerReflectionResponse> Ask(
      const std::vector<rf::ServerReflectionRequest>& asks, grpc::Status* status) {
    auto stub = rf::ServerReflection::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    auto stream = stub->ServerReflectionInfo(&ctx);
    std::vector<rf::ServerReflectionResponse> responses;
    for (const auto& ask : asks) {
      EXPECT_TRUE(stream->Write(ask));
      rf::ServerReflectionResponse response;
      EXPECT_TRUE(stream->Read(&response));
      responses.push_back(response);
    }
    stream->WritesDone();
    rf::ServerReflectionResponse extra;
    while (stream->Read(&extra)) ADD_FAILURE() << "an unasked response: " << extra.DebugString();
    *status = stream->Finish();
    return responses;
  }

  static std::set<std::string> FileNames(const rf::ServerReflectionResponse& response) {
    std::set<std::string> names;
    for (const std::string& bytes : response.file_descriptor_response().file_descriptor_proto()) {
      google::protobuf::FileDescriptorProto file;
      EXPECT_TRUE(file.ParseFromString(bytes));
      names.insert(file.name());
    }
    return names;
  }
};

TEST_F(ReflectionTest, AnswersEachRequestOfAStreamInTurn) {
  rf::ServerReflectionRequest list;
  list.set_list_services("");
  rf::ServerReflectionRequest symbol;
  symbol.set_file_containing_symbol("komputed.v1.EvalRequest");
  rf::ServerReflectionRequest file;
  file.set_file_by_filename("grpc/health/v1/health.proto");
  grpc::Status status;
  const auto responses = Ask({list, symbol, file}, &status);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(responses.size(), 3u);

  std::set<std::string> services;
  for (const auto& s : responses[0].list_services_response().service()) services.insert(s.name());
  EXPECT_EQ(services, (std::set<std::string>{"komputed.v1.Devices", "komputed.v1.Sessions",
                                             "komputed.v1.Tensors", "komputed.v1.Algorithms",
                                             "komputed.v1.Sequences", "grpc.health.v1.Health",
                                             "grpc.reflection.v1alpha.ServerReflection"}));

  EXPECT_EQ(responses[1].original_request().file_containing_symbol(), "komputed.v1.EvalRequest");
  EXPECT_TRUE(FileNames(responses[1]).contains("komputed/v1/komputed.proto"))
      << responses[1].DebugString();
  EXPECT_EQ(FileNames(responses[2]), std::set<std::string>{"grpc/health/v1/health.proto"});
}

TEST_F(ReflectionTest, SendsADependencyOncePerStream) {
  // The file asked for comes again when asked again; the files that it imports (if any) only the
  // first time.
  rf::ServerReflectionRequest symbol;
  symbol.set_file_containing_symbol("komputed.v1.Sequences");
  grpc::Status status;
  const auto responses = Ask({symbol, symbol}, &status);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(responses.size(), 2u);
  const std::set<std::string> first = FileNames(responses[0]);
  ASSERT_TRUE(first.contains("komputed/v1/komputed.proto"));
  EXPECT_EQ(FileNames(responses[1]), std::set<std::string>{"komputed/v1/komputed.proto"});
  EXPECT_EQ(responses[0].file_descriptor_response().file_descriptor_proto_size(),
            static_cast<int>(first.size()));
}

TEST_F(ReflectionTest, UnknownNamesAreNotFoundAndTheStreamGoesOn) {
  rf::ServerReflectionRequest symbol;
  symbol.set_file_containing_symbol("komputed.v1.NoSuchThing");
  rf::ServerReflectionRequest file;
  file.set_file_by_filename("no/such.proto");
  rf::ServerReflectionRequest numbers;
  numbers.set_all_extension_numbers_of_type("komputed.v1.NoSuchMessage");
  rf::ServerReflectionRequest empty;
  rf::ServerReflectionRequest list;
  list.set_list_services("");
  grpc::Status status;
  const auto responses = Ask({symbol, file, numbers, empty, list}, &status);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(responses.size(), 5u);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(responses[i].has_error_response()) << responses[i].DebugString();
    EXPECT_EQ(responses[i].error_response().error_code(),
              static_cast<int>(grpc::StatusCode::NOT_FOUND));
  }
  EXPECT_THAT(responses[0].error_response().error_message(),
              ::testing::HasSubstr("komputed.v1.NoSuchThing"));
  EXPECT_THAT(responses[1].error_response().error_message(), ::testing::HasSubstr("no/such.proto"));
  EXPECT_EQ(responses[3].error_response().error_code(),
            static_cast<int>(grpc::StatusCode::UNIMPLEMENTED));
  EXPECT_EQ(responses[4].list_services_response().service_size(), 7);
}

TEST_F(ReflectionTest, ExtensionNumbersOfAMessageWithoutExtensions) {
  rf::ServerReflectionRequest numbers;
  numbers.set_all_extension_numbers_of_type("komputed.v1.EvalRequest");
  grpc::Status status;
  const auto responses = Ask({numbers}, &status);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(responses.size(), 1u);
  ASSERT_TRUE(responses[0].has_all_extension_numbers_response()) << responses[0].DebugString();
  EXPECT_EQ(responses[0].all_extension_numbers_response().base_type_name(),
            "komputed.v1.EvalRequest");
  EXPECT_EQ(responses[0].all_extension_numbers_response().extension_number_size(), 0);
}

}  // namespace
}  // namespace komputed::server::testing
