#include "komputed/core/algorithm.h"

#include <algorithm>
#include <array>

#include "absl/strings/str_cat.h"
#include "komputed/core/op_semantics.h"
#include "komputed/core/shader.h"
#include "komputed/core/spirv_module.h"
#include "komputed/core/status.h"
#include "komputed/core/workgroup_loop.h"
#include "shader_intake.h"

namespace komputed::core {

namespace {

// The objects that algorithms with the same code, specialisation and layout share (Device::Share):
// the set layouts, the pipeline layout and the compute pipeline. Destroyed in reverse order of
// declaration.
struct SharedPipeline {
  DescriptorSetLayoutHandle set_layout;
  DescriptorSetLayoutHandle cancel_layout;  // set 1: the cancel word, when there is one
  PipelineLayoutHandle layout;
  PipelineHandle pipeline;
};

// What a SharedPipeline is made from, all of it: the code the driver gets, the specialisation,
// the number of tensors, whether there is a cancel word and the push-constant range; and the
// scope that it is shared in.
// The descriptor type of binding i: a storage image for an image, else a storage buffer.
VkDescriptorType DescriptorTypeOf(const Tensor& t) {
  return t.is_image() ? VK_DESCRIPTOR_TYPE_STORAGE_IMAGE : VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
}

std::string SharedPipelineKey(const std::vector<uint32_t>& code, const AlgorithmSpec& spec,
                              uint32_t push_constant_range) {
  std::string bindings;  // 'b' or 'i' per binding: the set layout
  for (const auto& t : spec.tensors) bindings.push_back(t->is_image() ? 'i' : 'b');
  std::string key =
      absl::StrCat("pipeline ", spec.share_scope.size(), ":", spec.share_scope, " ", bindings, " ",
                   spec.cancel != nullptr, " ", push_constant_range, " ", spec.spec_constant_size,
                   " ", spec.spec_constants.size(), " ", code.size(), ":");
  key.append(reinterpret_cast<const char*>(spec.spec_constants.data()), spec.spec_constants.size());
  key.append(reinterpret_cast<const char*>(code.data()), code.size() * sizeof(uint32_t));
  return key;
}

// The set layouts, pipeline layout and compute pipeline of `code` as `spec` specialises it.
absl::StatusOr<std::shared_ptr<const SharedPipeline>> MakeSharedPipeline(
    Device& device, const std::vector<uint32_t>& code, const AlgorithmSpec& spec,
    uint32_t push_constant_range) {
  const VkDevice dev = device.handle();
  auto p = std::make_shared<SharedPipeline>();
  VkShaderModuleCreateInfo mi{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
  mi.codeSize = code.size() * sizeof(uint32_t);
  mi.pCode = code.data();
  VkShaderModule module = VK_NULL_HANDLE;
  KD_RETURN_IF_ERROR(
      device.Check(vkCreateShaderModule(dev, &mi, nullptr, &module), "vkCreateShaderModule"));
  // Only the pipeline's creation needs the module.
  const ShaderModuleHandle module_handle(dev, module);

  const uint32_t n = static_cast<uint32_t>(spec.tensors.size());
  std::vector<VkDescriptorSetLayoutBinding> bindings(n);
  for (uint32_t i = 0; i < n; ++i) {
    bindings[i] = {i, DescriptorTypeOf(*spec.tensors[i]), 1, VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
  }
  VkDescriptorSetLayoutCreateInfo li{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
  li.bindingCount = n;
  li.pBindings = bindings.data();
  VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
  KD_RETURN_IF_ERROR(device.Check(vkCreateDescriptorSetLayout(dev, &li, nullptr, &set_layout),
                                  "vkCreateDescriptorSetLayout"));
  p->set_layout = DescriptorSetLayoutHandle(dev, set_layout);

  if (spec.cancel != nullptr) {
    VkDescriptorSetLayoutBinding word{kCancelBinding, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1,
                                      VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
    VkDescriptorSetLayoutCreateInfo ci{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
    ci.bindingCount = 1;
    ci.pBindings = &word;
    VkDescriptorSetLayout cancel_layout = VK_NULL_HANDLE;
    KD_RETURN_IF_ERROR(device.Check(vkCreateDescriptorSetLayout(dev, &ci, nullptr, &cancel_layout),
                                    "vkCreateDescriptorSetLayout"));
    p->cancel_layout = DescriptorSetLayoutHandle(dev, cancel_layout);
  }

  VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, push_constant_range};
  static_assert(kCancelSet == 1, "the cancel word's set follows the tensors'");
  const VkDescriptorSetLayout layouts[2] = {set_layout, p->cancel_layout.get()};
  VkPipelineLayoutCreateInfo pli{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
  pli.setLayoutCount = spec.cancel != nullptr ? 2 : 1;
  pli.pSetLayouts = layouts;
  pli.pushConstantRangeCount = push_constant_range == 0 ? 0 : 1;
  pli.pPushConstantRanges = &range;
  VkPipelineLayout layout = VK_NULL_HANDLE;
  KD_RETURN_IF_ERROR(
      device.Check(vkCreatePipelineLayout(dev, &pli, nullptr, &layout), "vkCreatePipelineLayout"));
  p->layout = PipelineLayoutHandle(dev, layout);

  std::vector<VkSpecializationMapEntry> entries;
  if (!spec.spec_constants.empty()) {
    const uint32_t count =
        static_cast<uint32_t>(spec.spec_constants.size() / spec.spec_constant_size);
    for (uint32_t i = 0; i < count; ++i) {
      entries.push_back({i, i * spec.spec_constant_size, spec.spec_constant_size});
    }
  }
  VkSpecializationInfo si{};
  si.mapEntryCount = static_cast<uint32_t>(entries.size());
  si.pMapEntries = entries.data();
  si.dataSize = spec.spec_constants.size();
  si.pData = spec.spec_constants.data();

  VkComputePipelineCreateInfo ci{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
  ci.stage = {VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO};
  ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  ci.stage.module = module;
  ci.stage.pName = "main";
  ci.stage.pSpecializationInfo = entries.empty() ? nullptr : &si;
  ci.layout = layout;
  VkPipeline pipeline = VK_NULL_HANDLE;
  KD_RETURN_IF_ERROR(
      device.Check(vkCreateComputePipelines(dev, VK_NULL_HANDLE, 1, &ci, nullptr, &pipeline),
                   "vkCreateComputePipelines"));
  p->pipeline = PipelineHandle(dev, pipeline);
  return std::shared_ptr<const SharedPipeline>(std::move(p));
}

}  // namespace

// The Vulkan objects of one build: the shared pipeline, and the algorithm's own descriptor sets
// bound to its tensors and cancel word. Destroyed in reverse order of declaration.
struct Algorithm::Pipeline {
  std::vector<std::shared_ptr<Tensor>> tensors;  // kept alive while bound
  std::shared_ptr<const SharedPipeline> shared;
  DescriptorPoolHandle pool;
  VkDescriptorSet set = VK_NULL_HANDLE;         // freed with pool
  VkDescriptorSet cancel_set = VK_NULL_HANDLE;  // freed with pool
  std::shared_ptr<CancelWord> cancel;
  Workgroup workgroup;
  uint32_t push_constant_range = 0;  // bytes of the layout's push-constant range
};

Algorithm::Algorithm(std::shared_ptr<Device> device) : device_(std::move(device)) {}
Algorithm::~Algorithm() = default;

absl::StatusOr<std::shared_ptr<Algorithm>> Algorithm::Create(std::shared_ptr<Device> device,
                                                             AlgorithmSpec spec) {
  auto algorithm = std::shared_ptr<Algorithm>(new Algorithm(std::move(device)));
  KD_RETURN_IF_ERROR(algorithm->Rebuild(std::move(spec)));
  return algorithm;
}

absl::StatusOr<std::shared_ptr<Algorithm::Pipeline>> Algorithm::Build(
    const AlgorithmSpec& spec) const {
  Device& device = *device_;
  const VkPhysicalDeviceLimits& limits = device.limits();
  VkDevice dev = device.handle();

  // Validate everything before creating anything.
  if (spec.spirv.empty()) return absl::InvalidArgumentError("the algorithm's SPIR-V is empty");
  for (size_t i = 0; i < spec.tensors.size(); ++i) {
    const auto& t = spec.tensors[i];
    if (t == nullptr) return absl::InvalidArgumentError(absl::StrCat("tensor ", i, " is null"));
    if (&t->device() != &device) {
      return absl::FailedPreconditionError(
          absl::StrCat("tensor ", i, " belongs to another device"));
    }
    if (!t->is_image() && t->byte_size() > limits.maxStorageBufferRange) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", i, " has ", t->byte_size(),
                       " bytes, over the device's maxStorageBufferRange (",
                       limits.maxStorageBufferRange, " bytes); it cannot be bound to a shader"));
    }
  }
  const uint32_t wg[3] = {spec.workgroup.x, spec.workgroup.y, spec.workgroup.z};
  for (int d = 0; d < 3; ++d) {
    if (wg[d] == 0 || wg[d] > limits.maxComputeWorkGroupCount[d]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "workgroup count ", std::string(1, "xyz"[d]), "=", wg[d], " is outside 1..",
          limits.maxComputeWorkGroupCount[d], " (the device's maxComputeWorkGroupCount)"));
    }
  }
  if (spec.push_constants.size() % 4 != 0 ||
      spec.push_constants.size() > limits.maxPushConstantsSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("push constants of ", spec.push_constants.size(),
                     " bytes: they must be a multiple of 4 and at most ",
                     limits.maxPushConstantsSize, " bytes (the device's maxPushConstantsSize)"));
  }
  if (!spec.spec_constants.empty() &&
      (spec.spec_constant_size == 0 || spec.spec_constants.size() % spec.spec_constant_size != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "specialization constants of ", spec.spec_constants.size(),
        " bytes are not a whole number of ", spec.spec_constant_size, "-byte constants"));
  }
  const uint32_t api_version = device.properties().apiVersion;
  KD_RETURN_IF_ERROR(ValidateSpirv(spec.spirv, api_version));
  const SpirvModule reflection = SpirvModule::Parse(spec.spirv);
  KD_ASSIGN_OR_RETURN(const ShaderInterface interface, CheckShader(reflection, spec, device));
  // The driver gets the clamped module, with the watchdog's cancel checks when it has a word; the
  // spec keeps the original.
  std::vector<uint32_t> code = spec.spirv;
  if (spec.clamp_buffer_accesses) {
    KD_ASSIGN_OR_RETURN(code, ClampBufferAccesses(code, api_version));
  }
  // Entry checks only where the dispatch could run long without them: a module with loops
  // (which the back-edge checks stop only once they are running), or a loop-free one whose
  // invocations together may execute more than UncheckedWorkLimit instructions. Measured before
  // the workgroup loop, which adds a loop of its own (checked at its back edge).
  std::optional<uint64_t> per_invocation;
  if (spec.cancel != nullptr) {
    KD_ASSIGN_OR_RETURN(per_invocation, LoopFreeInstructionBound(code));
  }
  // A dispatch of more workgroups than it may keep on the device at once loops over fewer.
  Workgroup dispatched = spec.workgroup;
  uint32_t loop_main = 0, loop_body = 0;  // the workgroup loop's functions, when there is one
  {
    const std::array<uint64_t, 3> local =
        reflection.LocalSize(SpecConstants{spec.spec_constants, spec.spec_constant_size});
    const uint64_t invocations = local[0] * local[1] * local[2];
    // Not on a CPU device by itself: it has one queue, which a bound cannot free for anyone,
    // and lavapipe ends loops after 65535 iterations of an invocation, its loops inside the
    // workgroup loop's counted together.
    const bool cpu = device.properties().deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
    uint32_t resident = spec.resident_workgroups;
    if (resident == 0 && !cpu) resident = device.ResidentWorkgroupLimit(invocations);
    const uint64_t total = uint64_t{spec.workgroup.x} * spec.workgroup.y * spec.workgroup.z;
    resident = std::min(resident, limits.maxComputeWorkGroupCount[0]);
    if (resident != 0 && total > resident) {
      absl::StatusOr<LoopedModule> looped = LoopOverWorkgroups(
          code, {{spec.workgroup.x, spec.workgroup.y, spec.workgroup.z}, resident});
      if (!looped.ok() && !absl::IsUnimplemented(looped.status())) return looped.status();
      // A module of a form the loop does not take (or, should it ever be, one that the loop
      // makes invalid) is dispatched as it is: the watchdog still bounds how long it holds the
      // device.
      if (looped.ok() && ValidateSpirv(looped->spirv, api_version).ok()) {
        code = std::move(looped->spirv);
        dispatched = {resident, 1, 1};
        loop_main = looped->main;
        loop_body = looped->body;
      }
    }
  }
  if (spec.cancel != nullptr) {
    CancelCheckOptions checks;
    if (per_invocation.has_value()) {
      const unsigned __int128 work = static_cast<unsigned __int128>(*per_invocation) *
                                     spec.workgroup.x * spec.workgroup.y * spec.workgroup.z *
                                     limits.maxComputeWorkGroupInvocations;
      checks.check_entry = work > UncheckedWorkLimit(device);
    }
    if (loop_main != 0) {
      // The loop's body is checked at its entry instead, once per virtual workgroup, and the
      // loop itself, the same for the whole workgroup, ends once its calls return at once.
      if (checks.check_entry) checks.entry_checked_functions = {loop_body};
      checks.check_entry = false;
      checks.unchecked_loop_functions = {loop_main};
    }
    KD_ASSIGN_OR_RETURN(code, AddCancelChecks(code, checks));
    absl::Status valid = ValidateSpirv(code, api_version);
    if (!valid.ok()) {
      return absl::InternalError(absl::StrCat(
          "the shader with the watchdog's cancel checks added is not valid: ", valid.message()));
    }
  }

  auto p = std::make_shared<Pipeline>();
  p->tensors = spec.tensors;
  p->workgroup = dispatched;
  p->cancel = spec.cancel;
  p->push_constant_range = interface.push_constant_range;
  const std::string key = SharedPipelineKey(code, spec, p->push_constant_range);
  p->shared = std::static_pointer_cast<const SharedPipeline>(device.Shared(key));
  if (p->shared == nullptr) {
    KD_ASSIGN_OR_RETURN(std::shared_ptr<const SharedPipeline> made,
                        MakeSharedPipeline(device, code, spec, p->push_constant_range));
    p->shared = std::static_pointer_cast<const SharedPipeline>(device.Share(key, std::move(made)));
  }
  const SharedPipeline& shared = *p->shared;

  const uint32_t n = static_cast<uint32_t>(spec.tensors.size());
  const uint32_t sets = (n > 0 ? 1 : 0) + (p->cancel != nullptr ? 1 : 0);
  if (sets > 0) {
    uint32_t images = 0;
    for (const auto& t : spec.tensors) images += t->is_image() ? 1 : 0;
    VkDescriptorPoolSize sizes[2] = {
        {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, n - images + (p->cancel != nullptr ? 1 : 0)},
        {VK_DESCRIPTOR_TYPE_STORAGE_IMAGE, images}};
    const bool buffers = sizes[0].descriptorCount > 0;
    VkDescriptorPoolCreateInfo pi{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
    pi.maxSets = sets;
    pi.poolSizeCount = (buffers ? 1 : 0) + (images > 0 ? 1 : 0);
    pi.pPoolSizes = buffers ? sizes : sizes + 1;
    VkDescriptorPool pool = VK_NULL_HANDLE;
    KD_RETURN_IF_ERROR(
        device.Check(vkCreateDescriptorPool(dev, &pi, nullptr, &pool), "vkCreateDescriptorPool"));
    p->pool = DescriptorPoolHandle(dev, pool);
  }
  if (p->cancel != nullptr) {
    VkDescriptorSetLayout cancel_layout = shared.cancel_layout.get();
    VkDescriptorSetAllocateInfo ai{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
    ai.descriptorPool = p->pool.get();
    ai.descriptorSetCount = 1;
    ai.pSetLayouts = &cancel_layout;
    KD_RETURN_IF_ERROR(device.Check(vkAllocateDescriptorSets(dev, &ai, &p->cancel_set),
                                    "vkAllocateDescriptorSets"));
    VkDescriptorBufferInfo info{p->cancel->buffer(), p->cancel->offset(), kCancelWordBytes};
    VkWriteDescriptorSet write{VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
    write.dstSet = p->cancel_set;
    write.dstBinding = kCancelBinding;
    write.descriptorCount = 1;
    write.descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    write.pBufferInfo = &info;
    vkUpdateDescriptorSets(dev, 1, &write, 0, nullptr);
  }

  if (n > 0) {
    VkDescriptorSetLayout set_layout = shared.set_layout.get();
    VkDescriptorSetAllocateInfo ai{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
    ai.descriptorPool = p->pool.get();
    ai.descriptorSetCount = 1;
    ai.pSetLayouts = &set_layout;
    KD_RETURN_IF_ERROR(
        device.Check(vkAllocateDescriptorSets(dev, &ai, &p->set), "vkAllocateDescriptorSets"));
    std::vector<VkDescriptorBufferInfo> infos(n);
    std::vector<VkDescriptorImageInfo> image_infos(n);
    std::vector<VkWriteDescriptorSet> writes(n);
    for (uint32_t i = 0; i < n; ++i) {
      const Tensor& t = *spec.tensors[i];
      writes[i] = {VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
      writes[i].dstSet = p->set;
      writes[i].dstBinding = i;
      writes[i].descriptorCount = 1;
      writes[i].descriptorType = DescriptorTypeOf(t);
      if (t.is_image()) {
        image_infos[i] = {VK_NULL_HANDLE, t.image_view(), VK_IMAGE_LAYOUT_GENERAL};
        writes[i].pImageInfo = &image_infos[i];
        continue;
      }
      // The tensor's bytes, not its buffer's padding to whole words: a shader's length() of a
      // tensor of 8- or 16-bit elements is its element count.
      infos[i] = {t.buffer(), 0, t.byte_size()};
      writes[i].pBufferInfo = &infos[i];
    }
    vkUpdateDescriptorSets(dev, n, writes.data(), 0, nullptr);
  }
  return p;
}

absl::Status Algorithm::Rebuild(AlgorithmSpec spec) {
  KD_ASSIGN_OR_RETURN(std::shared_ptr<Pipeline> pipeline, Build(spec));
  absl::MutexLock lock(&mu_);
  spec_ = std::move(spec);
  pipeline_ = std::move(pipeline);
  ++generation_;
  return absl::OkStatus();
}

absl::Status Algorithm::SetPushConstants(std::vector<uint8_t> values) {
  absl::MutexLock lock(&mu_);
  KD_RETURN_IF_ERROR(CheckPushConstantSize(values.size(), spec_.push_constants.size()));
  spec_.push_constants = std::move(values);
  return absl::OkStatus();
}

AlgorithmSpec Algorithm::spec() const {
  absl::MutexLock lock(&mu_);
  return spec_;
}

std::vector<std::shared_ptr<Tensor>> Algorithm::tensors() const {
  absl::MutexLock lock(&mu_);
  return spec_.tensors;
}

std::vector<uint8_t> Algorithm::push_constants() const {
  absl::MutexLock lock(&mu_);
  return spec_.push_constants;
}

size_t Algorithm::push_constant_size() const {
  absl::MutexLock lock(&mu_);
  return spec_.push_constants.size();
}

uint64_t Algorithm::generation() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

Workgroup Algorithm::dispatched() const {
  absl::MutexLock lock(&mu_);
  return pipeline_->workgroup;
}

std::shared_ptr<const void> Algorithm::RecordDispatch(VkCommandBuffer cb, uint64_t* generation,
                                                      const std::vector<uint8_t>* push_constants,
                                                      std::vector<uint8_t>* used) const {
  absl::MutexLock lock(&mu_);
  const Pipeline& p = *pipeline_;
  vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, p.shared->pipeline.get());
  if (p.set != VK_NULL_HANDLE) {
    vkCmdBindDescriptorSets(cb, VK_PIPELINE_BIND_POINT_COMPUTE, p.shared->layout.get(), 0, 1,
                            &p.set, 0, nullptr);
  }
  if (p.cancel_set != VK_NULL_HANDLE) {
    vkCmdBindDescriptorSets(cb, VK_PIPELINE_BIND_POINT_COMPUTE, p.shared->layout.get(), kCancelSet,
                            1, &p.cancel_set, 0, nullptr);
  }
  if (p.push_constant_range > 0) {
    // The whole range, the algorithm's values first: the rest of the shader's block reads zero.
    const std::vector<uint8_t>& source =
        push_constants != nullptr ? *push_constants : spec_.push_constants;
    std::vector<uint8_t> values(p.push_constant_range, 0);
    std::copy_n(source.begin(), std::min<size_t>(source.size(), values.size()), values.begin());
    vkCmdPushConstants(cb, p.shared->layout.get(), VK_SHADER_STAGE_COMPUTE_BIT, 0,
                       p.push_constant_range, values.data());
    if (used != nullptr) *used = source;
  }
  vkCmdDispatch(cb, p.workgroup.x, p.workgroup.y, p.workgroup.z);
  if (generation != nullptr) *generation = generation_;
  return pipeline_;
}

}  // namespace komputed::core
