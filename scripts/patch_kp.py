"""Patch an unpacked kp 0.9.0 sdist in place before it is built.

1. setup.py misses a comma between two CMake arguments, which drops
   -DPYTHON_EXECUTABLE so CMake may pick another interpreter.
2. The Python bindings do not expose kp::OpMemoryBarrier, and OpAlgoDispatch
   only orders transfer->compute, so two dispatches in one sequence that pass
   data through a buffer would race on a real GPU. We bind OpMemoryBarrier with
   integer Vulkan flags so the runtime can record compute->compute barriers.
3. OpDispatchBare / OpGlobalBarrier (see below): fewer pipeline barriers per kernel.
4. Descriptor sets from shared pools (see below): GPU memory per algorithm.
5. Small device-local buffers share memory blocks (see below): GPU memory per tensor.
6. One fence per Sequence, and an optional spin before the blocking wait (see below):
   submit latency.
7. Integer dot products enabled where the device has them (see below).
8. Algorithms built without the GIL (see below): pipelines compiled on several threads.
10. Cooperative matrices, 16-bit floats and storage, bfloat16 enabled where the device
    has them (see below).
Idempotent: running it twice changes nothing.
"""
import pathlib
import sys

src = pathlib.Path(sys.argv[1])
setup = src / "setup.py"
text = setup.read_text()
bad = "'-DKOMPUTE_OPT_DISABLE_VULKAN_VERSION_CHECK=ON'\n"
if bad in text:
    setup.write_text(text.replace(bad, "'-DKOMPUTE_OPT_DISABLE_VULKAN_VERSION_CHECK=ON',\n"))

main = src / "python" / "src" / "main.cpp"
text = main.read_text()
anchor = '    py::class_<kp::OpAlgoDispatch,'
binding = '''    py::class_<kp::OpMemoryBarrier, kp::OpBase, std::shared_ptr<kp::OpMemoryBarrier>>(
      m, "OpMemoryBarrier")
      .def(py::init([](const std::vector<std::shared_ptr<kp::Tensor>>& tensors,
                       uint32_t srcAccess, uint32_t dstAccess,
                       uint32_t srcStage, uint32_t dstStage, bool primary) {
               return std::make_shared<kp::OpMemoryBarrier>(
                 tensors, vk::AccessFlagBits(srcAccess), vk::AccessFlagBits(dstAccess),
                 vk::PipelineStageFlagBits(srcStage), vk::PipelineStageFlagBits(dstStage),
                 primary);
           }),
           py::arg("tensors"), py::arg("src_access"), py::arg("dst_access"),
           py::arg("src_stage"), py::arg("dst_stage"), py::arg("barrier_on_primary") = true);

'''
if "OpMemoryBarrier" not in text:
    if anchor not in text:
        sys.exit("patch_kp: anchor not found in python/src/main.cpp (not kp 0.9.0?)")
    text = text.replace(anchor, binding + anchor, 1)

# 3. Lean recording for long sequences: OpAlgoDispatch records one transfer->compute
#    buffer barrier per bound tensor before every dispatch (several pipeline barriers
#    per kernel). OpDispatchBare binds and dispatches only; OpGlobalBarrier is one
#    vkCmdPipelineBarrier with a global memory barrier, recorded where the runtime
#    finds a hazard.
ops_src = '''
namespace kp {
class OpDispatchBare : public OpBase
{
  public:
    explicit OpDispatchBare(const std::shared_ptr<Algorithm>& algorithm)
      : mAlgorithm(algorithm) {}
    void record(const vk::CommandBuffer& cb) override
    {
        mAlgorithm->recordBindCore(cb);
        mAlgorithm->recordBindPush(cb);
        mAlgorithm->recordDispatch(cb);
    }
    void preEval(const vk::CommandBuffer&) override {}
    void postEval(const vk::CommandBuffer&) override {}
  private:
    std::shared_ptr<Algorithm> mAlgorithm;
};

class OpGlobalBarrier : public OpBase
{
  public:
    OpGlobalBarrier(uint32_t srcAccess, uint32_t dstAccess, uint32_t srcStage, uint32_t dstStage)
      : mSrcAccess(srcAccess), mDstAccess(dstAccess), mSrcStage(srcStage), mDstStage(dstStage) {}
    void record(const vk::CommandBuffer& cb) override
    {
        vk::MemoryBarrier barrier{vk::AccessFlags(mSrcAccess), vk::AccessFlags(mDstAccess)};
        cb.pipelineBarrier(vk::PipelineStageFlags(mSrcStage), vk::PipelineStageFlags(mDstStage),
                           vk::DependencyFlags(), barrier, nullptr, nullptr);
    }
    void preEval(const vk::CommandBuffer&) override {}
    void postEval(const vk::CommandBuffer&) override {}
  private:
    uint32_t mSrcAccess, mDstAccess, mSrcStage, mDstStage;
};
}  // namespace kp

'''
ops_binding = '''    py::class_<kp::OpDispatchBare, kp::OpBase, std::shared_ptr<kp::OpDispatchBare>>(
      m, "OpDispatchBare")
      .def(py::init<const std::shared_ptr<kp::Algorithm>&>(), py::arg("algorithm"));
    py::class_<kp::OpGlobalBarrier, kp::OpBase, std::shared_ptr<kp::OpGlobalBarrier>>(
      m, "OpGlobalBarrier")
      .def(py::init<uint32_t, uint32_t, uint32_t, uint32_t>(), py::arg("src_access"),
           py::arg("dst_access"), py::arg("src_stage"), py::arg("dst_stage"));

'''
if "OpDispatchBare" not in text:
    module = "PYBIND11_MODULE(kp, m)"
    if module not in text or anchor not in text:
        sys.exit("patch_kp: anchors not found in python/src/main.cpp (not kp 0.9.0?)")
    text = text.replace(module, ops_src + module, 1).replace(anchor, ops_binding + anchor, 1)
main.write_text(text)

# 4. Every kp::Algorithm creates a descriptor pool for its one descriptor set. On the
#    H100's driver each pool holding a set takes ~64 KiB of GPU memory (measured with
#    400 pools: 71.7 KiB each; 400 sets from one pool: none), which for a decoder's
#    thousands of dispatches outweighs the model. Sets come from pools shared per
#    device instead (created with FREE_DESCRIPTOR_SET, so a destroyed algorithm
#    returns its set); the Manager destroys them with its device.
alg = src / "src" / "Algorithm.cpp"
atext = alg.read_text()
pool_src = '''
namespace kp {
namespace {
struct SharedDescriptorPools
{
    std::mutex lock;
    std::map<VkDevice, std::vector<std::shared_ptr<vk::DescriptorPool>>> pools;
};
SharedDescriptorPools&
sharedDescriptorPools()
{
    static SharedDescriptorPools* pools = new SharedDescriptorPools();
    return *pools;
}
const uint32_t SHARED_POOL_SETS = 256;
const uint32_t SHARED_POOL_DESCRIPTORS = SHARED_POOL_SETS * 16;
} // namespace

void
releaseSharedDescriptorPools(vk::Device& device)
{
    auto& shared = sharedDescriptorPools();
    std::lock_guard<std::mutex> guard(shared.lock);
    auto it = shared.pools.find((VkDevice)device);
    if (it == shared.pools.end())
        return;
    for (auto& pool : it->second)
        device.destroy(*pool, (vk::Optional<const vk::AllocationCallbacks>)nullptr);
    shared.pools.erase(it);
}
} // namespace kp
'''
old_pool = '''    std::vector<vk::DescriptorPoolSize> descriptorPoolSizes = {
        vk::DescriptorPoolSize(
          vk::DescriptorType::eStorageBuffer,
          static_cast<uint32_t>(this->mTensors.size()) // Descriptor count
          )
    };

    vk::DescriptorPoolCreateInfo descriptorPoolInfo(
      vk::DescriptorPoolCreateFlags(),
      1, // Max sets
      static_cast<uint32_t>(descriptorPoolSizes.size()),
      descriptorPoolSizes.data());

    KP_LOG_DEBUG("Kompute Algorithm creating descriptor pool");
    this->mDescriptorPool = std::make_shared<vk::DescriptorPool>();
    this->mDevice->createDescriptorPool(
      &descriptorPoolInfo, nullptr, this->mDescriptorPool.get());
    this->mFreeDescriptorPool = true;
'''
old_alloc = '''    vk::DescriptorSetAllocateInfo descriptorSetAllocateInfo(
      *this->mDescriptorPool,
      1, // Descriptor set layout count
      this->mDescriptorSetLayout.get());

    KP_LOG_DEBUG("Kompute Algorithm allocating descriptor sets");
    this->mDescriptorSet = std::make_shared<vk::DescriptorSet>();
    this->mDevice->allocateDescriptorSets(&descriptorSetAllocateInfo,
                                          this->mDescriptorSet.get());
    this->mFreeDescriptorSet = true;
'''
new_alloc = '''    KP_LOG_DEBUG("Kompute Algorithm allocating its descriptor set from a shared pool");
    this->mDescriptorSet = std::make_shared<vk::DescriptorSet>();
    {
        auto& shared = sharedDescriptorPools();
        std::lock_guard<std::mutex> guard(shared.lock);
        auto& pools = shared.pools[(VkDevice)*this->mDevice];
        vk::Result result = vk::Result::eErrorOutOfPoolMemory;
        if (!pools.empty()) {
            vk::DescriptorSetAllocateInfo info(*pools.back(), 1, this->mDescriptorSetLayout.get());
            result = this->mDevice->allocateDescriptorSets(&info, this->mDescriptorSet.get());
        }
        if (result != vk::Result::eSuccess) {   // full (or none yet): a new pool
            vk::DescriptorPoolSize size(vk::DescriptorType::eStorageBuffer,
                                        SHARED_POOL_DESCRIPTORS);
            vk::DescriptorPoolCreateInfo poolInfo(
              vk::DescriptorPoolCreateFlagBits::eFreeDescriptorSet, SHARED_POOL_SETS, 1, &size);
            auto pool = std::make_shared<vk::DescriptorPool>();
            if (this->mDevice->createDescriptorPool(&poolInfo, nullptr, pool.get()) !=
                vk::Result::eSuccess)
                throw std::runtime_error("Kompute Algorithm: creating a descriptor pool failed");
            pools.push_back(pool);
            vk::DescriptorSetAllocateInfo info(*pool, 1, this->mDescriptorSetLayout.get());
            if (this->mDevice->allocateDescriptorSets(&info, this->mDescriptorSet.get()) !=
                vk::Result::eSuccess)
                throw std::runtime_error("Kompute Algorithm: allocating a descriptor set failed");
        }
        this->mDescriptorPool = pools.back();
        this->mFreeDescriptorPool = false;   // shared: the set is freed, the pool kept
    }
    this->mFreeDescriptorSet = true;
'''
old_destroy = '''    if (this->mFreeDescriptorPool && this->mDescriptorPool) {
        KP_LOG_DEBUG("Kompute Algorithm Destroying Descriptor Pool");'''
new_destroy = '''    if (!this->mFreeDescriptorPool && this->mDescriptorPool && this->mDescriptorSet) {
        std::lock_guard<std::mutex> guard(sharedDescriptorPools().lock);
        this->mDevice->freeDescriptorSets(*this->mDescriptorPool, 1, this->mDescriptorSet.get());
        this->mDescriptorSet = nullptr;
        this->mDescriptorPool = nullptr;
    }

''' + old_destroy
if "sharedDescriptorPools" not in atext:
    include = '#include "kompute/Algorithm.hpp"\n'
    for a in (include, old_pool, old_alloc, old_destroy):
        if a not in atext:
            sys.exit("patch_kp: Algorithm.cpp is not kp 0.9.0's (anchor missing)")
    atext = atext.replace(include, include + "#include <map>\n#include <mutex>\n" + pool_src, 1)
    atext = atext.replace(old_pool, "", 1).replace(old_alloc, new_alloc, 1)
    atext = atext.replace(old_destroy, new_destroy, 1)
    alg.write_text(atext)
mgr_src = src / "src" / "Manager.cpp"
mtext = mgr_src.read_text()
m_anchor = '''    if (this->mFreeDevice) {
        KP_LOG_INFO("Destroying device");'''
if "releaseSharedDescriptorPools" not in mtext:
    if m_anchor not in mtext or "namespace kp {" not in mtext:
        sys.exit("patch_kp: Manager.cpp is not kp 0.9.0's (anchor missing)")
    mtext = mtext.replace("namespace kp {", "namespace kp {\nvoid releaseSharedDescriptorPools(vk::Device& device);\n", 1)
    mtext = mtext.replace(m_anchor, '''    if (this->mFreeDevice && this->mDevice) {
        releaseSharedDescriptorPools(*this->mDevice);
    }
''' + m_anchor, 1)
    mgr_src.write_text(mtext)
# 5. Every kp::Tensor allocates its own VkDeviceMemory. On the H100's driver each
#    allocation takes at least 64 KiB (measured with 2000 tensors of 4 B, 4 KiB and
#    64 KiB: 64.0 KiB each), and a compiled decoder holds hundreds of small buffers
#    (activations, norms' weights, counters). Device-local buffers up to 256 KiB are
#    bound at offsets of shared 8 MiB blocks instead; a block is freed when the last
#    tensor bound in it is destroyed (no reuse inside a block: a program's buffers
#    live and die together).
tensor_cpp = src / "src" / "Tensor.cpp"
tensor_hpp = src / "src" / "include" / "kompute" / "Tensor.hpp"
ttext, htext = tensor_cpp.read_text(), tensor_hpp.read_text()
block_src = """
#include <algorithm>
#include <mutex>
#include <vector>

namespace kp {
namespace {
struct SharedMemoryBlock
{
    VkDevice device;
    vk::DeviceMemory memory;
    uint32_t type;
    vk::DeviceSize used;
    uint32_t live;
};
std::mutex&
sharedBlockLock()
{
    static std::mutex* lock = new std::mutex();
    return *lock;
}
std::vector<SharedMemoryBlock*>&
sharedBlocks()
{
    static std::vector<SharedMemoryBlock*>* blocks = new std::vector<SharedMemoryBlock*>();
    return *blocks;
}
const vk::DeviceSize SHARED_SMALL_BYTES = 256 * 1024;
const vk::DeviceSize SHARED_BLOCK_BYTES = 8 * 1024 * 1024;

// Binds a small device-local buffer at an offset of the newest block of its device and
// memory type (a new block when it does not fit); nullptr: allocate it on its own.
SharedMemoryBlock*
bindSharedBlock(vk::Device& device, vk::PhysicalDevice& physical, vk::Buffer& buffer,
                vk::MemoryPropertyFlags flags)
{
    if (flags != vk::MemoryPropertyFlags(vk::MemoryPropertyFlagBits::eDeviceLocal))
        return nullptr;
    vk::MemoryRequirements req = device.getBufferMemoryRequirements(buffer);
    if (req.size > SHARED_SMALL_BYTES)
        return nullptr;
    vk::PhysicalDeviceMemoryProperties props = physical.getMemoryProperties();
    uint32_t type = props.memoryTypeCount;
    for (uint32_t i = 0; i < props.memoryTypeCount; i++) {
        if ((req.memoryTypeBits & (1u << i)) &&
            (props.memoryTypes[i].propertyFlags & flags) == flags) {
            type = i;
            break;
        }
    }
    if (type == props.memoryTypeCount)
        return nullptr;
    vk::DeviceSize align = std::max<vk::DeviceSize>(req.alignment, 1);
    std::lock_guard<std::mutex> guard(sharedBlockLock());
    auto& blocks = sharedBlocks();
    SharedMemoryBlock* block = nullptr;
    vk::DeviceSize offset = 0;
    for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
        if ((*it)->device != (VkDevice)device || (*it)->type != type)
            continue;
        offset = ((*it)->used + align - 1) / align * align;
        if (offset + req.size <= SHARED_BLOCK_BYTES)
            block = *it;
        break;
    }
    if (!block) {
        vk::MemoryAllocateInfo info(SHARED_BLOCK_BYTES, type);
        vk::DeviceMemory memory;
        if (device.allocateMemory(&info, nullptr, &memory) != vk::Result::eSuccess)
            return nullptr;
        block = new SharedMemoryBlock{ (VkDevice)device, memory, type, 0, 0 };
        blocks.push_back(block);
        offset = 0;
    }
    device.bindBufferMemory(buffer, block->memory, offset);
    block->used = offset + req.size;
    block->live += 1;
    return block;
}

void
releaseSharedBlock(vk::Device& device, void* handle)
{
    auto* block = static_cast<SharedMemoryBlock*>(handle);
    std::lock_guard<std::mutex> guard(sharedBlockLock());
    if (--block->live > 0)
        return;
    auto& blocks = sharedBlocks();
    blocks.erase(std::remove(blocks.begin(), blocks.end(), block), blocks.end());
    device.freeMemory(block->memory, (vk::Optional<const vk::AllocationCallbacks>)nullptr);
    delete block;
}
} // namespace
} // namespace kp
"""
old_bind = """    this->mPrimaryMemory = std::make_shared<vk::DeviceMemory>();
    this->allocateBindMemory(this->mPrimaryBuffer,
                             this->mPrimaryMemory,
                             this->getPrimaryMemoryPropertyFlags());
    this->mFreePrimaryMemory = true;
"""
new_bind = """    this->mPrimaryMemory = std::make_shared<vk::DeviceMemory>();
    this->mSharedBlock = bindSharedBlock(*this->mDevice, *this->mPhysicalDevice,
                                         *this->mPrimaryBuffer,
                                         this->getPrimaryMemoryPropertyFlags());
    if (this->mSharedBlock) {
        *this->mPrimaryMemory = static_cast<SharedMemoryBlock*>(this->mSharedBlock)->memory;
        this->mFreePrimaryMemory = false;   // the block's: released below, in destroy()
    } else {
        this->allocateBindMemory(this->mPrimaryBuffer,
                                 this->mPrimaryMemory,
                                 this->getPrimaryMemoryPropertyFlags());
        this->mFreePrimaryMemory = true;
    }
"""
old_free = """    if (this->mFreeStagingMemory) {
        if (!this->mStagingMemory) {"""
new_free = """    if (this->mSharedBlock) {   // after the buffer bound in it is destroyed
        releaseSharedBlock(*this->mDevice, this->mSharedBlock);
        this->mSharedBlock = nullptr;
        this->mPrimaryMemory = nullptr;
    }

""" + old_free
h_anchor = "    bool mFreePrimaryMemory = false;\n"
if "mSharedBlock" not in htext:
    if h_anchor not in htext:
        sys.exit("patch_kp: Tensor.hpp is not kp 0.9.0's (anchor missing)")
    tensor_hpp.write_text(htext.replace(h_anchor, h_anchor + "    void* mSharedBlock = nullptr;   // dynamo_vulkan patch 5\n", 1))
if "bindSharedBlock" not in ttext:
    include = '#include "kompute/Tensor.hpp"\n'
    for a in (include, old_bind, old_free):
        if a not in ttext:
            sys.exit("patch_kp: Tensor.cpp is not kp 0.9.0's (anchor missing)")
    ttext = ttext.replace(include, include + block_src, 1).replace(old_bind, new_bind, 1)
    tensor_cpp.write_text(ttext.replace(old_free, new_free, 1))
# 6. Submit latency. kp creates a fence for every submit and destroys it after the wait;
#    on the H100's driver that pair costs ~0.52 ms (vkCreateFence 266 us, the wait and
#    vkDestroyFence 279 us, against 35 us for a whole submit+wait of an empty sequence
#    with a reused fence). Each Sequence now keeps one fence and resets it before each
#    submit (kp.set_fence_reuse(False) restores a fence per submit, for comparing). The
#    wait may also poll vkGetFenceStatus for a bounded time before it blocks, for
#    drivers that wake a blocked waiter late (kp.set_fence_spin_us; 0, the default,
#    blocks at once).
seq_cpp = src / "src" / "Sequence.cpp"
seq_hpp = src / "src" / "include" / "kompute" / "Sequence.hpp"
stext, shtext = seq_cpp.read_text(), seq_hpp.read_text()
fence_src = """
#include <atomic>
#include <chrono>

namespace kp {
std::atomic<uint64_t> gFenceSpinNs{ 0 };
std::atomic<bool> gFenceReuse{ true };
}
"""
old_submit = """    this->mFence = this->mDevice->createFence(vk::FenceCreateInfo());
"""
new_submit = """    this->mFenceReused = gFenceReuse.load();
    if (!this->mFenceReused) {
        this->mFence = this->mDevice->createFence(vk::FenceCreateInfo());
    } else if (!this->mReusedFence) {
        this->mReusedFence = this->mDevice->createFence(vk::FenceCreateInfo());
        this->mFence = this->mReusedFence;
    } else {
        this->mFence = this->mReusedFence;
        if (this->mDevice->resetFences(1, &this->mFence) != vk::Result::eSuccess)
            throw std::runtime_error("Kompute Sequence: resetting its fence failed");
    }
"""
old_wait = """    vk::Result result =
      this->mDevice->waitForFences(1, &this->mFence, VK_TRUE, waitFor);
    this->mDevice->destroy(
      this->mFence, (vk::Optional<const vk::AllocationCallbacks>)nullptr);
"""
new_wait = """    uint64_t spinNs = gFenceSpinNs.load(std::memory_order_relaxed);
    if (spinNs > 0) {
        auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(spinNs);
        while (this->mDevice->getFenceStatus(this->mFence) == vk::Result::eNotReady &&
               std::chrono::steady_clock::now() < until) {
        }
    }
    vk::Result result =
      this->mDevice->waitForFences(1, &this->mFence, VK_TRUE, waitFor);
    if (!this->mFenceReused)
        this->mDevice->destroy(
          this->mFence, (vk::Optional<const vk::AllocationCallbacks>)nullptr);
"""
old_destroy = """    if (this->mFreeCommandBuffer) {
        KP_LOG_INFO("Freeing CommandBuffer");"""
new_destroy = """    if (this->mReusedFence) {
        this->mDevice->destroy(this->mReusedFence,
                               (vk::Optional<const vk::AllocationCallbacks>)nullptr);
        this->mReusedFence = nullptr;
    }

""" + old_destroy
h_anchor = "    vk::Fence mFence;\n"
if "mReusedFence" not in shtext:
    if h_anchor not in shtext:
        sys.exit("patch_kp: Sequence.hpp is not kp 0.9.0's (anchor missing)")
    seq_hpp.write_text(shtext.replace(
        h_anchor, h_anchor + "    vk::Fence mReusedFence = nullptr;   // dynamo_vulkan patch 6\n"
                             "    bool mFenceReused = false;\n", 1))
if "gFenceReuse" not in stext:
    include = '#include "kompute/Sequence.hpp"\n'
    for a in (include, old_submit, old_wait, old_destroy):
        if a not in stext:
            sys.exit("patch_kp: Sequence.cpp is not kp 0.9.0's (anchor missing)")
    stext = stext.replace(include, include + fence_src, 1).replace(old_submit, new_submit, 1)
    seq_cpp.write_text(stext.replace(old_wait, new_wait, 1).replace(old_destroy, new_destroy, 1))
text = main.read_text()
fence_binding = """    m.def("set_fence_spin_us", [](uint64_t us) { kp::gFenceSpinNs = us * 1000; }, py::arg("us"),
          "Poll a submit's fence this long before blocking on it (0: block at once).");
    m.def("fence_spin_us", []() { return uint64_t(kp::gFenceSpinNs.load() / 1000); });
    m.def("set_fence_reuse", [](bool reuse) { kp::gFenceReuse = reuse; }, py::arg("reuse"),
          "Whether a Sequence resets one fence per submit (true) or creates and destroys one.");
    m.def("fence_reuse", []() { return kp::gFenceReuse.load(); });
"""
if "set_fence_spin_us" not in text:
    module = "PYBIND11_MODULE(kp, m)\n{\n"
    if module not in text:
        sys.exit("patch_kp: module definition not found in python/src/main.cpp")
    text = text.replace(module, "#include <atomic>\nnamespace kp {\nextern std::atomic<uint64_t> gFenceSpinNs;\n"
                        "extern std::atomic<bool> gFenceReuse;\n}\n" + module + fence_binding, 1)
    main.write_text(text)
# 7. Integer dot products (VK_KHR_shader_integer_dot_product): kp enables no device
#    features, and a shader may use OpSDot/OpSUDot only where the device was created with
#    shaderIntegerDotProduct. Where the device has the extension and the feature, the
#    device is now created with both; kp.integer_dot_product() says whether it was (the
#    GGUF mat-vec's int8-plane path, lowering/gguf.py, is chosen only then).
mgr_cpp = src / "src" / "Manager.cpp"
mtext = mgr_cpp.read_text()
old_create = """    vk::DeviceCreateInfo deviceCreateInfo(vk::DeviceCreateFlags(),
                                          deviceQueueCreateInfos.size(),
                                          deviceQueueCreateInfos.data(),
                                          {},
                                          {},
                                          validExtensions.size(),
                                          validExtensions.data());
"""
new_create = """    // dynamo_vulkan patch 7: integer dot products where the device has them
    vk::PhysicalDeviceShaderIntegerDotProductFeatures dotFeatures;
    const char* dotExt = "VK_KHR_shader_integer_dot_product";
    bool dotOn = false;
    if (uniqueExtensionNames.count(dotExt) != 0) {
        vk::PhysicalDeviceFeatures2 features2;
        features2.pNext = &dotFeatures;
        physicalDevice.getFeatures2(&features2);
        dotOn = dotFeatures.shaderIntegerDotProduct == VK_TRUE;
        dotFeatures.pNext = nullptr;
        bool listed = false;
        for (const char* e : validExtensions)
            listed = listed || std::string(e) == dotExt;
        if (dotOn && !listed)
            validExtensions.push_back(dotExt);
    }
    gIntegerDotProduct = dotOn;
""" + old_create + """    if (dotOn)
        deviceCreateInfo.pNext = &dotFeatures;
"""
if "gIntegerDotProduct" not in mtext:
    if old_create not in mtext or '#include "kompute/Manager.hpp"\n' not in mtext:
        sys.exit("patch_kp: Manager.cpp is not kp 0.9.0's (anchor missing)")
    mtext = mtext.replace('#include "kompute/Manager.hpp"\n', '#include "kompute/Manager.hpp"\n'
                          '#include <atomic>\nnamespace kp {\nstd::atomic<bool> gIntegerDotProduct{ false };\n}\n', 1)
    mgr_cpp.write_text(mtext.replace(old_create, new_create, 1))
text = main.read_text()
if "integer_dot_product" not in text:
    module = "PYBIND11_MODULE(kp, m)\n{\n"
    if module not in text:
        sys.exit("patch_kp: module definition not found in python/src/main.cpp")
    text = text.replace(module, "namespace kp {\nextern std::atomic<bool> gIntegerDotProduct;\n}\n" + module +
                        '    m.def("integer_dot_product", []() { return kp::gIntegerDotProduct.load(); },\n'
                        '          "Whether the last device created has shaderIntegerDotProduct enabled.");\n', 1)
    main.write_text(text)
# 8. Pipelines built on several threads. Creating an algorithm compiles its pipeline in
#    the driver (lavapipe: 82 ms each, LLVM; SmolLM2's first compile creates 541), and
#    kp's binding holds the GIL throughout. Manager.algorithm_nogil copies its arguments
#    under the GIL and builds the algorithm without it; the manager's list of algorithms
#    is then appended under a lock (descriptor pools and memory blocks already have
#    theirs: patches 4 and 5), so the runtime can build a program's algorithms from a
#    thread pool.
mgr_hpp = src / "src" / "include" / "kompute" / "Manager.hpp"
htext = mgr_hpp.read_text()
old_push = """        if (this->mManageResources) {
            this->mManagedAlgorithms.push_back(algorithm);
        }"""
new_push = """        if (this->mManageResources) {
            static std::mutex managedAlgorithmsLock;
            std::lock_guard<std::mutex> guard(managedAlgorithmsLock);
            this->mManagedAlgorithms.push_back(algorithm);
        }"""
if "managedAlgorithmsLock" not in htext:
    if old_push not in htext or "#pragma once\n" not in htext:
        sys.exit("patch_kp: Manager.hpp is not kp 0.9.0's (anchor missing)")
    htext = htext.replace("#pragma once\n", "#pragma once\n#include <mutex>\n", 1)
    mgr_hpp.write_text(htext.replace(old_push, new_push, 1))
text = main.read_text()
nogil = """      .def(
        "algorithm_nogil",
        [](kp::Manager& self,
           const std::vector<std::shared_ptr<kp::Tensor>>& tensors,
           const py::bytes& spirv,
           const kp::Workgroup& workgroup,
           const std::vector<uint32_t>& spec_consts) {
            std::string bytes = spirv;
            std::vector<uint32_t> spirvVec(bytes.size() / sizeof(uint32_t));
            std::memcpy(spirvVec.data(), bytes.data(), spirvVec.size() * sizeof(uint32_t));
            std::shared_ptr<kp::Algorithm> algorithm;
            {
                py::gil_scoped_release release;
                algorithm = self.algorithm<uint32_t, uint32_t>(
                  tensors, spirvVec, workgroup, spec_consts, std::vector<uint32_t>());
            }
            return algorithm;
        },
        "An algorithm with uint32 specialisation constants and no push constants, "
        "built without the GIL (other threads may build theirs meanwhile).",
        py::arg("tensors"), py::arg("spirv"), py::arg("workgroup"), py::arg("spec_consts"))
"""
anchor = """      .def(
        "algorithm",
"""
if "algorithm_nogil" not in text:
    if anchor not in text:
        sys.exit("patch_kp: Manager.algorithm binding not found in python/src/main.cpp")
    text = text.replace(anchor, nogil + anchor, 1)
    if "#include <cstring>" not in text:
        text = "#include <cstring>\n" + text
    main.write_text(text)
# 10. Tensor cores (VK_KHR_cooperative_matrix), 16-bit float arithmetic
#    (VK_KHR_shader_float16_int8), 16-bit storage buffers (VK_KHR_16bit_storage) and
#    bfloat16 (VK_KHR_shader_bfloat16): a shader may use them only where the device was
#    created with them, and kp enables none. Where the device lists an extension and its
#    feature, the device is now created with both (cooperativeMatrixRobustBufferAccess off:
#    the kernels bound their own loads). The structures are spelled out with their
#    sType values from vulkan_core.h 1.4 so that older headers (Debian 12's 1.3.239, which
#    predate both extensions) build it. kp.enabled_features() says what was enabled on
#    the last device created; the matmul lowering picks cooperative-matrix kernels from
#    it (lowering/matmul.py).
mtext = mgr_cpp.read_text()
anchor10 = """    this->mDevice = std::make_shared<vk::Device>();
    physicalDevice.createDevice(
"""
patch10 = """    // dynamo_vulkan patch 10: cooperative matrices, fp16, 16-bit storage, bf16
    struct DvkCoopMatFeatures {
        VkStructureType sType; void* pNext;
        VkBool32 cooperativeMatrix; VkBool32 cooperativeMatrixRobustBufferAccess;
    };
    struct DvkBFloat16Features {
        VkStructureType sType; void* pNext;
        VkBool32 shaderBFloat16Type; VkBool32 shaderBFloat16DotProduct;
        VkBool32 shaderBFloat16CooperativeMatrix;
    };
    VkPhysicalDeviceShaderFloat16Int8Features f16Features{};
    f16Features.sType = (VkStructureType)1000082000;
    VkPhysicalDevice16BitStorageFeatures s16Features{};
    s16Features.sType = (VkStructureType)1000083000;
    DvkCoopMatFeatures coopFeatures{ (VkStructureType)1000506000, nullptr, VK_FALSE, VK_FALSE };
    DvkBFloat16Features bf16Features{ (VkStructureType)1000141000, nullptr, VK_FALSE, VK_FALSE, VK_FALSE };
    const char* f16Ext = "VK_KHR_shader_float16_int8";
    const char* s16Ext = "VK_KHR_16bit_storage";
    const char* coopExt = "VK_KHR_cooperative_matrix";
    const char* bf16Ext = "VK_KHR_shader_bfloat16";
    auto dvkHas = [&](const char* e) { return uniqueExtensionNames.count(e) != 0; };
    auto dvkEnable = [&](const char* e) {
        bool listed = false;
        for (const char* v : validExtensions)
            listed = listed || std::string(v) == e;
        if (!listed)
            validExtensions.push_back(e);
    };
    {
        void* query = nullptr;
        if (dvkHas(f16Ext)) { f16Features.pNext = query; query = &f16Features; }
        if (dvkHas(s16Ext)) { s16Features.pNext = query; query = &s16Features; }
        if (dvkHas(coopExt)) { coopFeatures.pNext = query; query = &coopFeatures; }
        if (dvkHas(bf16Ext)) { bf16Features.pNext = query; query = &bf16Features; }
        if (query != nullptr) {
            vk::PhysicalDeviceFeatures2 features2;
            features2.pNext = query;
            physicalDevice.getFeatures2(&features2);
        }
    }
    bool f16On = dvkHas(f16Ext) && f16Features.shaderFloat16 == VK_TRUE;
    bool s16On = dvkHas(s16Ext) && s16Features.storageBuffer16BitAccess == VK_TRUE;
    bool coopOn = dvkHas(coopExt) && coopFeatures.cooperativeMatrix == VK_TRUE && f16On;
    bool bf16On = dvkHas(bf16Ext) && bf16Features.shaderBFloat16Type == VK_TRUE;
    coopFeatures.cooperativeMatrixRobustBufferAccess = VK_FALSE;
    if (!coopOn)
        bf16Features.shaderBFloat16CooperativeMatrix = VK_FALSE;
    const void* chain = deviceCreateInfo.pNext;
    if (f16On) { dvkEnable(f16Ext); f16Features.pNext = const_cast<void*>(chain); chain = &f16Features; }
    if (s16On) { dvkEnable(s16Ext); s16Features.pNext = const_cast<void*>(chain); chain = &s16Features; }
    if (coopOn) { dvkEnable(coopExt); coopFeatures.pNext = const_cast<void*>(chain); chain = &coopFeatures; }
    if (bf16On) { dvkEnable(bf16Ext); bf16Features.pNext = const_cast<void*>(chain); chain = &bf16Features; }
    deviceCreateInfo.pNext = chain;
    deviceCreateInfo.enabledExtensionCount = (uint32_t)validExtensions.size();
    deviceCreateInfo.ppEnabledExtensionNames = validExtensions.data();
    gEnabledFeatures = { { "cooperative_matrix", coopOn },
                         { "shader_float16", f16On },
                         { "storage_buffer_16bit", s16On },
                         { "bfloat16", bf16On },
                         { "bfloat16_cooperative_matrix",
                           bf16On && bf16Features.shaderBFloat16CooperativeMatrix == VK_TRUE } };

"""
if "gEnabledFeatures" not in mtext:
    if anchor10 not in mtext or "std::atomic<bool> gIntegerDotProduct{ false };\n}\n" not in mtext:
        sys.exit("patch_kp: Manager.cpp lacks patch 7 or the createDevice anchor (patch 10)")
    mtext = mtext.replace("std::atomic<bool> gIntegerDotProduct{ false };\n}\n",
                          "std::atomic<bool> gIntegerDotProduct{ false };\n"
                          "std::map<std::string, bool> gEnabledFeatures;\n}\n", 1)
    mtext = mtext.replace("#include <atomic>\n", "#include <atomic>\n#include <map>\n#include <string>\n", 1)
    mgr_cpp.write_text(mtext.replace(anchor10, patch10 + anchor10, 1))
text = main.read_text()
if "enabled_features" not in text:
    module = "PYBIND11_MODULE(kp, m)\n{\n"
    if module not in text:
        sys.exit("patch_kp: module definition not found in python/src/main.cpp")
    text = text.replace(module, "#include <map>\nnamespace kp {\nextern std::map<std::string, bool> gEnabledFeatures;\n}\n"
                        + module +
                        '    m.def("enabled_features", []() { return kp::gEnabledFeatures; },\n'
                        '          "The optional features (patch 10) the last device created was created with.");\n', 1)
    main.write_text(text)
# a marker the setup scripts probe to know this build carries every patch above (9: a
# build marked 8 carried a reverted patch, shared command pools, and lacks patch 8 here;
# 10: patch 10)
PATCHES = 10
text = main.read_text()
if "dynamo_vulkan_patches" not in text:
    module = "PYBIND11_MODULE(kp, m)\n{\n"
    if module not in text:
        sys.exit("patch_kp: module definition not found in python/src/main.cpp")
    text = text.replace(module, module + f'    m.attr("dynamo_vulkan_patches") = {PATCHES};\n', 1)
    main.write_text(text)
