"""Patch an unpacked kp 0.9.0 sdist in place before it is built.

1. setup.py misses a comma between two CMake arguments, which drops
   -DPYTHON_EXECUTABLE so CMake may pick another interpreter.
2. The Python bindings do not expose kp::OpMemoryBarrier, and OpAlgoDispatch
   only orders transfer->compute, so two dispatches in one sequence that pass
   data through a buffer would race on a real GPU. We bind OpMemoryBarrier with
   integer Vulkan flags so the runtime can record compute->compute barriers.
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
    main.write_text(text.replace(anchor, binding + anchor, 1))
