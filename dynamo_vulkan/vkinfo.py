"""The Vulkan physical devices, asked of the loader through ctypes.

No logical device is created and nothing beyond the loader (libvulkan.so.1) is
needed: not kp, and not `vulkaninfo` (vulkan-tools), which a pip install lacks. The
structures are those of vulkan_core.h (Vulkan 1.1 core plus the 1.2 driver
properties), laid out by ctypes.
"""
from __future__ import annotations

import ctypes

VK_SUCCESS, VK_INCOMPLETE = 0, 5
ST_APPLICATION_INFO, ST_INSTANCE_CREATE_INFO = 0, 1
ST_PROPERTIES_2 = 1000059001
ST_SUBGROUP_PROPERTIES = 1000094000
ST_MAINTENANCE_3_PROPERTIES = 1000168000
ST_DRIVER_PROPERTIES = 1000196000
ST_COOPERATIVE_MATRIX_PROPERTIES = 1000506001
MEMORY_HEAP_DEVICE_LOCAL = 0x1
DEVICE_TYPES = {0: "other", 1: "integrated_gpu", 2: "discrete_gpu", 3: "virtual_gpu", 4: "cpu"}
# the optional device extensions the kernels or kp patches use, or may
FEATURE_EXTENSIONS = {
    "VK_KHR_shader_integer_dot_product": "integer_dot_product",
    "VK_KHR_shader_float16_int8": "float16_int8",
    "VK_KHR_16bit_storage": "16bit_storage",
    "VK_KHR_8bit_storage": "8bit_storage",
    "VK_EXT_subgroup_size_control": "subgroup_size_control",
    "VK_KHR_cooperative_matrix": "cooperative_matrix",
    "VK_NV_cooperative_matrix2": "cooperative_matrix2",
    "VK_KHR_shader_bfloat16": "bfloat16",
    "VK_KHR_shader_subgroup_extended_types": "subgroup_extended_types",
}

# VkComponentTypeKHR and VkScopeKHR values (vulkan_core.h 1.4) as the names kernels use
COMPONENT_TYPES = {0: "f16", 1: "f32", 2: "f64", 3: "s8", 4: "s16", 5: "s32", 6: "s64",
                   7: "u8", 8: "u16", 9: "u32", 10: "u64", 1000141000: "bf16"}
SCOPES = {1: "device", 2: "workgroup", 3: "subgroup", 5: "queue_family"}

# VkPhysicalDeviceLimits: runs of fields of one C type, in the header's order
_LIMITS = (
    ("I", "maxImageDimension1D maxImageDimension2D maxImageDimension3D maxImageDimensionCube "
          "maxImageArrayLayers maxTexelBufferElements maxUniformBufferRange maxStorageBufferRange "
          "maxPushConstantsSize maxMemoryAllocationCount maxSamplerAllocationCount"),
    ("Q", "bufferImageGranularity sparseAddressSpaceSize"),
    ("I", "maxBoundDescriptorSets maxPerStageDescriptorSamplers maxPerStageDescriptorUniformBuffers "
          "maxPerStageDescriptorStorageBuffers maxPerStageDescriptorSampledImages "
          "maxPerStageDescriptorStorageImages maxPerStageDescriptorInputAttachments maxPerStageResources "
          "maxDescriptorSetSamplers maxDescriptorSetUniformBuffers maxDescriptorSetUniformBuffersDynamic "
          "maxDescriptorSetStorageBuffers maxDescriptorSetStorageBuffersDynamic "
          "maxDescriptorSetSampledImages maxDescriptorSetStorageImages maxDescriptorSetInputAttachments "
          "maxVertexInputAttributes maxVertexInputBindings maxVertexInputAttributeOffset "
          "maxVertexInputBindingStride maxVertexOutputComponents maxTessellationGenerationLevel "
          "maxTessellationPatchSize maxTessellationControlPerVertexInputComponents "
          "maxTessellationControlPerVertexOutputComponents maxTessellationControlPerPatchOutputComponents "
          "maxTessellationControlTotalOutputComponents maxTessellationEvaluationInputComponents "
          "maxTessellationEvaluationOutputComponents maxGeometryShaderInvocations "
          "maxGeometryInputComponents maxGeometryOutputComponents maxGeometryOutputVertices "
          "maxGeometryTotalOutputComponents maxFragmentInputComponents maxFragmentOutputAttachments "
          "maxFragmentDualSrcAttachments maxFragmentCombinedOutputResources maxComputeSharedMemorySize "
          "maxComputeWorkGroupCount[3] maxComputeWorkGroupInvocations maxComputeWorkGroupSize[3] "
          "subPixelPrecisionBits subTexelPrecisionBits mipmapPrecisionBits maxDrawIndexedIndexValue "
          "maxDrawIndirectCount"),
    ("f", "maxSamplerLodBias maxSamplerAnisotropy"),
    ("I", "maxViewports maxViewportDimensions[2]"),
    ("f", "viewportBoundsRange[2]"),
    ("I", "viewportSubPixelBits"),
    ("N", "minMemoryMapAlignment"),
    ("Q", "minTexelBufferOffsetAlignment minUniformBufferOffsetAlignment minStorageBufferOffsetAlignment"),
    ("i", "minTexelOffset"),
    ("I", "maxTexelOffset"),
    ("i", "minTexelGatherOffset"),
    ("I", "maxTexelGatherOffset"),
    ("f", "minInterpolationOffset maxInterpolationOffset"),
    ("I", "subPixelInterpolationOffsetBits maxFramebufferWidth maxFramebufferHeight maxFramebufferLayers "
          "framebufferColorSampleCounts framebufferDepthSampleCounts framebufferStencilSampleCounts "
          "framebufferNoAttachmentsSampleCounts maxColorAttachments sampledImageColorSampleCounts "
          "sampledImageIntegerSampleCounts sampledImageDepthSampleCounts sampledImageStencilSampleCounts "
          "storageImageSampleCounts maxSampleMaskWords timestampComputeAndGraphics"),
    ("f", "timestampPeriod"),
    ("I", "maxClipDistances maxCullDistances maxCombinedClipAndCullDistances discreteQueuePriorities"),
    ("f", "pointSizeRange[2] lineWidthRange[2] pointSizeGranularity lineWidthGranularity"),
    ("I", "strictLines standardSampleLocations"),
    ("Q", "optimalBufferCopyOffsetAlignment optimalBufferCopyRowPitchAlignment nonCoherentAtomSize"),
)
_CTYPES = {"I": ctypes.c_uint32, "Q": ctypes.c_uint64, "N": ctypes.c_size_t, "f": ctypes.c_float,
           "i": ctypes.c_int32}


def _fields(runs) -> list:
    out = []
    for code, names in runs:
        for name in names.split():
            base, _, count = name.partition("[")
            t = _CTYPES[code]
            out.append((base, t * int(count.rstrip("]")) if count else t))
    return out


class Limits(ctypes.Structure):
    _fields_ = _fields(_LIMITS)


class Properties(ctypes.Structure):
    _fields_ = [("apiVersion", ctypes.c_uint32), ("driverVersion", ctypes.c_uint32),
                ("vendorID", ctypes.c_uint32), ("deviceID", ctypes.c_uint32),
                ("deviceType", ctypes.c_int32), ("deviceName", ctypes.c_char * 256),
                ("pipelineCacheUUID", ctypes.c_uint8 * 16), ("limits", Limits),
                ("sparseProperties", ctypes.c_uint32 * 5)]


class Properties2(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int32), ("pNext", ctypes.c_void_p), ("properties", Properties)]


class SubgroupProperties(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int32), ("pNext", ctypes.c_void_p), ("subgroupSize", ctypes.c_uint32),
                ("supportedStages", ctypes.c_uint32), ("supportedOperations", ctypes.c_uint32),
                ("quadOperationsInAllStages", ctypes.c_uint32)]


class Maintenance3Properties(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int32), ("pNext", ctypes.c_void_p),
                ("maxPerSetDescriptors", ctypes.c_uint32), ("maxMemoryAllocationSize", ctypes.c_uint64)]


class DriverProperties(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int32), ("pNext", ctypes.c_void_p), ("driverID", ctypes.c_int32),
                ("driverName", ctypes.c_char * 256), ("driverInfo", ctypes.c_char * 256),
                ("conformanceVersion", ctypes.c_uint8 * 4)]


class CooperativeMatrixProperties(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int32), ("pNext", ctypes.c_void_p), ("MSize", ctypes.c_uint32),
                ("NSize", ctypes.c_uint32), ("KSize", ctypes.c_uint32), ("AType", ctypes.c_int32),
                ("BType", ctypes.c_int32), ("CType", ctypes.c_int32), ("ResultType", ctypes.c_int32),
                ("saturatingAccumulation", ctypes.c_uint32), ("scope", ctypes.c_int32)]


class MemoryHeap(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint64), ("flags", ctypes.c_uint32)]


class MemoryProperties(ctypes.Structure):
    _fields_ = [("memoryTypeCount", ctypes.c_uint32), ("memoryTypes", ctypes.c_uint32 * 64),
                ("memoryHeapCount", ctypes.c_uint32), ("memoryHeaps", MemoryHeap * 16)]


class ExtensionProperties(ctypes.Structure):
    _fields_ = [("extensionName", ctypes.c_char * 256), ("specVersion", ctypes.c_uint32)]


class _AppInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int32), ("pNext", ctypes.c_void_p),
                ("pApplicationName", ctypes.c_char_p), ("applicationVersion", ctypes.c_uint32),
                ("pEngineName", ctypes.c_char_p), ("engineVersion", ctypes.c_uint32),
                ("apiVersion", ctypes.c_uint32)]


class _InstanceInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int32), ("pNext", ctypes.c_void_p), ("flags", ctypes.c_uint32),
                ("pApplicationInfo", ctypes.POINTER(_AppInfo)),
                ("enabledLayerCount", ctypes.c_uint32), ("ppEnabledLayerNames", ctypes.c_void_p),
                ("enabledExtensionCount", ctypes.c_uint32), ("ppEnabledExtensionNames", ctypes.c_void_p)]


class LoaderMissing(OSError):
    """libvulkan.so.1 (the Vulkan loader) could not be loaded."""


def version_string(v: int) -> str:
    return f"{(v >> 22) & 0x7F}.{(v >> 12) & 0x3FF}.{v & 0xFFF}"


def loader():
    """libvulkan.so.1, or LoaderMissing."""
    try:
        return ctypes.CDLL("libvulkan.so.1")
    except OSError as e:
        raise LoaderMissing(str(e)) from e


def _cooperative_matrices(lib, inst, handle) -> list[dict]:
    """The matrix shapes and types the device's tensor cores multiply
    (vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR, found through
    vkGetInstanceProcAddr since the loader exports no extension functions): each as
    {m, n, k, a, b, c, result, saturating, scope}, types as COMPONENT_TYPES names."""
    lib.vkGetInstanceProcAddr.restype = ctypes.c_void_p
    lib.vkGetInstanceProcAddr.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    addr = lib.vkGetInstanceProcAddr(inst, b"vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR")
    if not addr:
        return []
    fn = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint32),
                          ctypes.POINTER(CooperativeMatrixProperties))(addr)
    n = ctypes.c_uint32(0)
    if fn(handle, ctypes.byref(n), None) != VK_SUCCESS or n.value == 0:
        return []
    arr = (CooperativeMatrixProperties * n.value)()
    for p in arr:
        p.sType = ST_COOPERATIVE_MATRIX_PROPERTIES
    if fn(handle, ctypes.byref(n), arr) not in (VK_SUCCESS, VK_INCOMPLETE):
        return []
    kind = lambda v: COMPONENT_TYPES.get(v, str(v))
    return [{"m": p.MSize, "n": p.NSize, "k": p.KSize, "a": kind(p.AType), "b": kind(p.BType),
             "c": kind(p.CType), "result": kind(p.ResultType),
             "saturating": bool(p.saturatingAccumulation), "scope": SCOPES.get(p.scope, str(p.scope))}
            for p in arr[:n.value]]


def matrix_shape_name(s: dict) -> str:
    """One cooperative-matrix shape as text: '16x16x16 f16*f16+f32->f32 subgroup'."""
    return f"{s['m']}x{s['n']}x{s['k']} {s['a']}*{s['b']}+{s['c']}->{s['result']} {s['scope']}"


def _describe(lib, handle, index: int, inst=None) -> dict:
    """What one physical device is and has (the keys list_devices documents)."""
    exts = []
    n = ctypes.c_uint32(0)
    if lib.vkEnumerateDeviceExtensionProperties(handle, None, ctypes.byref(n), None) == VK_SUCCESS:
        arr = (ExtensionProperties * n.value)()
        if lib.vkEnumerateDeviceExtensionProperties(handle, None, ctypes.byref(n), arr) in (
                VK_SUCCESS, VK_INCOMPLETE):
            exts = sorted(e.extensionName.decode(errors="replace") for e in arr[:n.value])
    base = Properties()
    lib.vkGetPhysicalDeviceProperties(handle, ctypes.byref(base))
    # the 1.1 chain: subgroup and maintenance3 are core there; driver properties are
    # core in 1.2 or VK_KHR_driver_properties, and chained only where the device has them
    sub = SubgroupProperties(ST_SUBGROUP_PROPERTIES, None)
    m3 = Maintenance3Properties(ST_MAINTENANCE_3_PROPERTIES, ctypes.cast(ctypes.pointer(sub), ctypes.c_void_p))
    drv = DriverProperties(ST_DRIVER_PROPERTIES, ctypes.cast(ctypes.pointer(m3), ctypes.c_void_p))
    has_1_1 = base.apiVersion >= (1 << 22 | 1 << 12)
    has_driver = base.apiVersion >= (1 << 22 | 2 << 12) or "VK_KHR_driver_properties" in exts
    head = drv if has_driver else m3
    props2 = Properties2(ST_PROPERTIES_2, ctypes.cast(ctypes.pointer(head), ctypes.c_void_p))
    if has_1_1:
        lib.vkGetPhysicalDeviceProperties2(handle, ctypes.byref(props2))
        props = props2.properties
    else:
        props = base
    mem = MemoryProperties()
    lib.vkGetPhysicalDeviceMemoryProperties(handle, ctypes.byref(mem))
    heaps = [mem.memoryHeaps[i] for i in range(min(mem.memoryHeapCount, 16))]
    lim = props.limits
    info = {
        "index": index,
        "name": props.deviceName.decode(errors="replace"),
        "type": DEVICE_TYPES.get(props.deviceType, "other"),
        "vendor_id": props.vendorID,
        "device_id": props.deviceID,
        "api_version": version_string(props.apiVersion),
        "driver_version": props.driverVersion,
        "pipeline_cache_uuid": bytes(props.pipelineCacheUUID).hex(),
        "memory": sum(h.size for h in heaps if h.flags & MEMORY_HEAP_DEVICE_LOCAL),
        "max_storage_buffer_range": lim.maxStorageBufferRange,
        "max_compute_shared_memory_size": lim.maxComputeSharedMemorySize,
        "max_push_constants_size": lim.maxPushConstantsSize,
        "max_storage_buffers_per_stage": min(lim.maxPerStageDescriptorStorageBuffers,
                                             lim.maxPerStageResources),
        "max_compute_work_group_count": tuple(lim.maxComputeWorkGroupCount),
        "max_compute_work_group_invocations": lim.maxComputeWorkGroupInvocations,
        "timestamp_period_ns": float(lim.timestampPeriod),
        "timestamps_supported": bool(lim.timestampComputeAndGraphics),
        "extensions": exts,
        "features": sorted(v for k, v in FEATURE_EXTENSIONS.items() if k in exts),
    }
    if has_1_1:
        info["subgroup_size"] = sub.subgroupSize
        info["max_memory_allocation_size"] = m3.maxMemoryAllocationSize
    if has_driver:
        info["driver_name"] = drv.driverName.decode(errors="replace")
        info["driver_info"] = drv.driverInfo.decode(errors="replace")
    if inst is not None and "VK_KHR_cooperative_matrix" in exts:
        info["cooperative_matrix_shapes"] = _cooperative_matrices(lib, inst, handle)
    return info


def physical_devices() -> list[dict]:
    """Every physical device the loader enumerates, in its order (kp.Manager(i) opens the
    i-th of the same list). Raises LoaderMissing without a loader; [] when no instance
    can be made or no driver is installed."""
    lib = loader()
    app = _AppInfo(ST_APPLICATION_INFO, None, b"dynamo_vulkan", 0, b"none", 0, (1 << 22) | (1 << 12))
    create = _InstanceInfo(ST_INSTANCE_CREATE_INFO, None, 0, ctypes.pointer(app), 0, None, 0, None)
    inst = ctypes.c_void_p()
    if lib.vkCreateInstance(ctypes.byref(create), None, ctypes.byref(inst)) != VK_SUCCESS:
        return []
    try:
        n = ctypes.c_uint32(0)
        if lib.vkEnumeratePhysicalDevices(inst, ctypes.byref(n), None) != VK_SUCCESS or n.value == 0:
            return []
        handles = (ctypes.c_void_p * n.value)()
        if lib.vkEnumeratePhysicalDevices(inst, ctypes.byref(n), handles) not in (VK_SUCCESS, VK_INCOMPLETE):
            return []
        return [_describe(lib, ctypes.c_void_p(handles[i]), i, inst) for i in range(n.value)]
    finally:
        lib.vkDestroyInstance(inst, None)
