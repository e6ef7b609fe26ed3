#include "reflection.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>

#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace komputed::server {

namespace pb = google::protobuf;
using grpc::reflection::v1alpha::ServerReflectionRequest;

// One ServerReflectionInfo stream: reads a request, writes its response, reads the next, until
// the client half-closes (OK) or the stream breaks.
class ReflectionService::Stream final : public StreamReactor<Request, Response> {
 public:
  Stream(StreamOps<Request, Response>* ops, const std::vector<std::string>* services)
      : StreamReactor(ops), services_(services) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(Cancelled() ? grpc::Status(grpc::StatusCode::CANCELLED, "the stream was cancelled")
                         : grpc::Status::OK);
      return;
    }
    response_.Clear();
    Answer();
    StartWrite(&response_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the stream was broken"));
      return;
    }
    StartRead(&request_);
  }

  void OnDone() override { delete this; }

 private:
  void Answer() {
    response_.set_valid_host(request_.host());
    *response_.mutable_original_request() = request_;
    const pb::DescriptorPool* pool = pb::DescriptorPool::generated_pool();
    switch (request_.message_request_case()) {
      case ServerReflectionRequest::kListServices:
        for (const std::string& name : *services_) {
          response_.mutable_list_services_response()->add_service()->set_name(name);
        }
        return;
      case ServerReflectionRequest::kFileByFilename:
        return SendFile(pool->FindFileByName(request_.file_by_filename()),
                        absl::StrCat("file ", request_.file_by_filename()));
      case ServerReflectionRequest::kFileContainingSymbol:
        return SendFile(pool->FindFileContainingSymbol(request_.file_containing_symbol()),
                        absl::StrCat("symbol ", request_.file_containing_symbol()));
      case ServerReflectionRequest::kFileContainingExtension: {
        const auto& ask = request_.file_containing_extension();
        const pb::Descriptor* type = pool->FindMessageTypeByName(ask.containing_type());
        const pb::FieldDescriptor* extension =
            type == nullptr ? nullptr : pool->FindExtensionByNumber(type, ask.extension_number());
        return SendFile(
            extension == nullptr ? nullptr : extension->file(),
            absl::StrCat("extension ", ask.extension_number(), " of ", ask.containing_type()));
      }
      case ServerReflectionRequest::kAllExtensionNumbersOfType: {
        const std::string& name = request_.all_extension_numbers_of_type();
        const pb::Descriptor* type = pool->FindMessageTypeByName(name);
        if (type == nullptr) return Error(grpc::StatusCode::NOT_FOUND, "message type " + name);
        std::vector<const pb::FieldDescriptor*> extensions;
        pool->FindAllExtensions(type, &extensions);
        auto* numbers = response_.mutable_all_extension_numbers_response();
        numbers->set_base_type_name(name);
        for (const pb::FieldDescriptor* e : extensions) numbers->add_extension_number(e->number());
        return;
      }
      case ServerReflectionRequest::MESSAGE_REQUEST_NOT_SET:
        break;
    }
    Error(grpc::StatusCode::UNIMPLEMENTED, "");
  }

  void Error(grpc::StatusCode code, const std::string& what) {
    auto* error = response_.mutable_error_response();
    error->set_error_code(static_cast<int32_t>(code));
    error->set_error_message(code == grpc::StatusCode::NOT_FOUND
                                 ? absl::StrCat("no ", what, " in the daemon's descriptors")
                                 : std::string("the request names nothing this server answers"));
  }

  // `file` and those it depends on, each once per stream (the client keeps what it was sent).
  void SendFile(const pb::FileDescriptor* file, const std::string& what) {
    if (file == nullptr) return Error(grpc::StatusCode::NOT_FOUND, what);
    auto* files = response_.mutable_file_descriptor_response();
    std::vector<const pb::FileDescriptor*> todo = {file};
    while (!todo.empty()) {
      const pb::FileDescriptor* f = todo.back();
      todo.pop_back();
      // The file asked for goes again if asked again; a dependency only once.
      if (f != file && !sent_.insert(f->name()).second) continue;
      sent_.insert(f->name());
      pb::FileDescriptorProto proto;
      f->CopyTo(&proto);
      proto.SerializeToString(files->add_file_descriptor_proto());
      for (int i = 0; i < f->dependency_count(); ++i) todo.push_back(f->dependency(i));
    }
  }

  const std::vector<std::string>* const services_;
  Request request_;
  Response response_;
  absl::flat_hash_set<std::string> sent_;  // files sent on this stream
};

ReflectionService::ReflectionService(std::vector<std::string> services)
    : services_([&] {
        services.push_back(grpc::reflection::v1alpha::ServerReflection::service_full_name());
        return std::move(services);
      }()) {}

void ReflectionService::AddTo(CallQueue& queue) {
  queue.AddBidiStream(this, &ReflectionService::RequestServerReflectionInfo,
                      &ReflectionService::ServeInfo);
}

StreamReactor<ReflectionService::Request, ReflectionService::Response>*
ReflectionService::ServeInfo(grpc::ServerContext*, StreamOps<Request, Response>* stream) {
  return new Stream(stream, &services_);
}

}  // namespace komputed::server
