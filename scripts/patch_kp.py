"""Patch an unpacked kp 0.9.0 sdist in place before it is built.

1. setup.py misses a comma between two CMake arguments, which drops
   -DPYTHON_EXECUTABLE so CMake may pick another interpreter.
2. The Python bindings do not expose kp::OpMemoryBarrier, and OpAlgoDispatch
   only orders transfer->compute, so two dispatches in one sequence that pass
   data through a buffer would race on a real GPU. We bind OpMemoryBarrier with
   integer Vulkan flags so the runtime can record compute->compute barriers.
3. OpDispatchBare / OpGlobalBarrier (see below): fewer pipeline barriers per kernel.
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
