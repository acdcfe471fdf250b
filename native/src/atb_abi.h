// Local declarations of the slice of the ATB / aclnn ABI the harness uses.
//
// The harness is built without CANN headers, so everything it calls through dlsym is declared here.
// compat_check.cpp includes this file next to the installed headers and static_asserts that the two
// agree; the CPU test double (native/testing/libatb_double.cpp) implements these declarations.
#pragma once

#include <cstdint>

struct aclTensor;  // opaque; same tag as aclnn's `typedef struct aclTensor aclTensor`

namespace atb {
class Operation;  // opaque
class Context;    // see the minimal definition below
}  // namespace atb

namespace mla_abi {

using Status = std::int32_t;  // atb::Status
using Stream = void *;        // aclrtStream

// aclDataType / aclFormat values we pass or name (acl/acl_base.h). Both enums are int-sized.
constexpr std::int32_t kAclFloat = 0;
constexpr std::int32_t kAclFloat16 = 1;
constexpr std::int32_t kAclInt32 = 3;
constexpr std::int32_t kAclInt64 = 9;
constexpr std::int32_t kAclBool = 12;
constexpr std::int32_t kAclBf16 = 27;
constexpr std::int32_t kAclFormatNchw = 0;
constexpr std::int32_t kAclFormatNhwc = 1;
constexpr std::int32_t kAclFormatNd = 2;
constexpr std::int32_t kAclFormatFractalNz = 29;

// atb::ErrorType in declaration order (include/atb/types.h); compat_check asserts each value.
#define MLA_ABI_STATUS_LIST(X)                                                                       \
    X(NO_ERROR) X(ERROR_INVALID_PARAM) X(ERROR_INVALID_GRAPH) X(ERROR_INTERNAL_ERROR) X(ERROR_RT_FAIL) \
    X(ERROR_INVALID_IN_TENSOR_NUM) X(ERROR_INVALID_TENSOR_DTYPE) X(ERROR_INVALID_TENSOR_FORMAT)        \
    X(ERROR_INVALID_TENSOR_DIM) X(ERROR_INVALID_TENSOR_SIZE) X(ERROR_OPERATION_NULL_RUNNER)            \
    X(ERROR_GRAPH_INFERSHAPE_FUNC_FAIL) X(ERROR_CANN_ERROR) X(ERROR_INVALID_TENSOR_INI_MATCH)          \
    X(ERROR_INVALID_TENSOR_ADDR) X(ERROR_INVALID_TENSOR_NUM) X(ERROR_INVALID_TENSOR_DIM_NUM)           \
    X(ERROR_INVALID_SINGLE_OPERATION_PARAM) X(ERROR_GRAPH_NODE_RESHAPE_FUNC_FAIL)                      \
    X(ERROR_INVALID_GRAPH_NODE_CHUNK) X(ERROR_INVALID_CONTEXT_ADDR) X(ERROR_INVALID_STREAM)            \
    X(ERROR_INVALID_WORKSPACE_SIZE) X(ERROR_INVALID_WORKSPACE_ADDR) X(ERROR_INVALID_OPERATION_ADDR)    \
    X(ERROR_HCCL_FAIL) X(ERROR_OUT_OF_DEVICE_MEMORY) X(ERROR_OUT_OF_HOST_MEMORY) X(ERROR_COMM_EMPTY)   \
    X(ERROR_COPY_HOST_MEMORY_FAIL)

#define MLA_ABI_STATUS_STRING(name) #name,
inline constexpr const char *kStatusNames[] = {MLA_ABI_STATUS_LIST(MLA_ABI_STATUS_STRING)};
#undef MLA_ABI_STATUS_STRING
inline constexpr std::int32_t kStatusCount = sizeof(kStatusNames) / sizeof(kStatusNames[0]);

// extern "C" entry points (include/atb/atb_acl.h, CANN/NNAL >= 8.2.RC1).
using GetWorkspaceSizeFn = Status (*)(const aclTensor *q, const aclTensor *qRope, const aclTensor *k,
                                      const aclTensor *kRope, const aclTensor *v, const aclTensor *qSeqLen,
                                      const aclTensor *kvSeqLen, const aclTensor *mask, std::int32_t headNum,
                                      float qkScale, std::int32_t kvHeadNum, int maskType,
                                      std::uint8_t cacheMode, aclTensor *attenOut,
                                      std::uint64_t *workspaceSize, atb::Operation **op,
                                      atb::Context *context);
using PreFillFn = Status (*)(void *workspace, std::uint64_t workspaceSize, atb::Operation *op,
                             atb::Context *context);
inline constexpr const char *kGetWorkspaceSizeSymbol = "AtbMLAPreFillGetWorkspaceSize";
inline constexpr const char *kPreFillSymbol = "AtbMLAPreFill";

// aclnn/acl_meta.h; templated on the enum types so compat_check can substitute the real enums.
template <class DataType, class Format>
using AclCreateTensorFnT = aclTensor *(*)(const std::int64_t *viewDims, std::uint64_t viewDimsNum,
                                          DataType dataType, const std::int64_t *stride,
                                          std::int64_t offset, Format format,
                                          const std::int64_t *storageDims, std::uint64_t storageDimsNum,
                                          void *tensorData);
using AclCreateTensorFn = AclCreateTensorFnT<std::int32_t, std::int32_t>;
using AclDestroyTensorFn = std::int32_t (*)(const aclTensor *tensor);
inline constexpr const char *kAclCreateTensorSymbol = "aclCreateTensor";
inline constexpr const char *kAclDestroyTensorSymbol = "aclDestroyTensor";

// C++ functions in namespace atb, resolved by their Itanium-mangled names.
using CreateContextFn = Status (*)(atb::Context **context);
using DestroyContextFn = Status (*)(atb::Context *context);
using DestroyOperationFn = Status (*)(atb::Operation *operation);
inline constexpr const char *kCreateContextSymbol = "_ZN3atb13CreateContextEPPNS_7ContextE";
inline constexpr const char *kDestroyContextSymbol = "_ZN3atb14DestroyContextEPNS_7ContextE";
inline constexpr const char *kDestroyOperationSymbol = "_ZN3atb16DestroyOperationEPNS_9OperationE";

}  // namespace mla_abi

#ifndef MLA_ABI_REAL_ATB_HEADERS
namespace atb {
// Minimal view of include/atb/context.h: only the vtable prefix up to SetExecuteStream, which is the
// first virtual after the (two-slot, Itanium) destructor. Objects are only ever made by
// atb::CreateContext and released by atb::DestroyContext, never by `delete` through this view.
class Context {
public:
    virtual ~Context() = default;
    virtual mla_abi::Status SetExecuteStream(mla_abi::Stream stream) = 0;

protected:
    Context() = default;
    Context(const Context &) = delete;
    Context &operator=(const Context &) = delete;
};
}  // namespace atb
#endif
