// Checks atb_abi.h against the installed CANN/ATB headers; built only where they exist
// (native/run_on_ascend.sh), or against the public header trees (native/check_headers.sh), never by pip:
//
//   g++ -std=c++17 -I"$ATB_HOME_PATH/include" -I"$ASCEND_HOME_PATH/include"
//       -I"$ASCEND_HOME_PATH/include/aclnn" -Inative/src native/src/compat_check.cpp -o compat_check
//   ./compat_check
//
// Compiling it proves the declarations agree (static_assert); running it checks the one thing a
// compiler cannot assert, that SetExecuteStream is the first virtual after the destructor.
//
// aclnn/acl_meta.h (aclTensor, aclCreateTensor, aclDestroyTensor) ships only with CANN. Where it is
// absent, check_headers.sh supplies a stand-in that declares the opaque aclnn types ATB's headers
// name and defines MLA_COMPAT_ACLNN_STANDIN; the aclCreateTensor/aclDestroyTensor checks are then
// skipped and the run says so.
#include <atb/atb_acl.h>
#include <atb/context.h>
#include <atb/operation.h>
#include <atb/types.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <type_traits>

#define MLA_ABI_REAL_ATB_HEADERS 1  // use the real atb::Context, not our minimal view
#include "atb_abi.h"

// The two extern "C" entry points.
static_assert(std::is_same_v<decltype(&AtbMLAPreFillGetWorkspaceSize), mla_abi::GetWorkspaceSizeFn>,
              "AtbMLAPreFillGetWorkspaceSize changed signature");
static_assert(std::is_same_v<decltype(&AtbMLAPreFill), mla_abi::PreFillFn>, "AtbMLAPreFill changed signature");

// aclnn tensor functions; the enums travel as int32 through our declaration.
#ifndef MLA_COMPAT_ACLNN_STANDIN
static_assert(std::is_same_v<decltype(&aclCreateTensor), mla_abi::AclCreateTensorFnT<aclDataType, aclFormat>>,
              "aclCreateTensor changed signature");
static_assert(std::is_same_v<decltype(&aclDestroyTensor), mla_abi::AclDestroyTensorFn>,
              "aclDestroyTensor changed signature");
#endif
static_assert(sizeof(aclDataType) == sizeof(std::int32_t) && sizeof(aclFormat) == sizeof(std::int32_t),
              "aclDataType/aclFormat are no longer int-sized");
static_assert(std::is_same_v<atb::Status, mla_abi::Status>, "atb::Status changed type");
static_assert(std::is_same_v<aclrtStream, mla_abi::Stream>, "aclrtStream changed type");

// Enum values we pass or name.
static_assert(ACL_FLOAT == mla_abi::kAclFloat && ACL_FLOAT16 == mla_abi::kAclFloat16);
static_assert(ACL_INT32 == mla_abi::kAclInt32 && ACL_BF16 == mla_abi::kAclBf16);
static_assert(ACL_INT64 == mla_abi::kAclInt64 && ACL_BOOL == mla_abi::kAclBool);
static_assert(ACL_FORMAT_NCHW == mla_abi::kAclFormatNchw && ACL_FORMAT_ND == mla_abi::kAclFormatNd);
static_assert(ACL_FORMAT_FRACTAL_NZ == mla_abi::kAclFormatFractalNz && ACL_FORMAT_NHWC == mla_abi::kAclFormatNhwc);
#define MLA_ABI_STATUS_ENUMERATOR(name) name,
namespace status_order {
enum Local : int { MLA_ABI_STATUS_LIST(MLA_ABI_STATUS_ENUMERATOR) };
}
#define MLA_ABI_CHECK_STATUS(name) \
    static_assert(static_cast<int>(atb::name) == static_cast<int>(status_order::name), #name " moved");
MLA_ABI_STATUS_LIST(MLA_ABI_CHECK_STATUS)
static_assert(static_cast<int>(atb::ERROR_COPY_HOST_MEMORY_FAIL) + 1 == mla_abi::kStatusCount);

// The atb:: functions resolved by mangled name: an overload with exactly our parameter types must
// exist (the mangled name follows from namespace, name and parameter types). Unevaluated, so no link.
static_assert(std::is_same_v<decltype(static_cast<mla_abi::CreateContextFn>(&atb::CreateContext)),
                             mla_abi::CreateContextFn>);
static_assert(std::is_same_v<decltype(static_cast<mla_abi::DestroyContextFn>(&atb::DestroyContext)),
                             mla_abi::DestroyContextFn>);
static_assert(std::is_same_v<decltype(static_cast<mla_abi::DestroyOperationFn>(&atb::DestroyOperation)),
                             mla_abi::DestroyOperationFn>);

// atb::Context: virtual destructor, SetExecuteStream(aclrtStream) returning Status.
static_assert(std::has_virtual_destructor_v<atb::Context>);
static_assert(std::is_same_v<decltype(&atb::Context::SetExecuteStream), atb::Status (atb::Context::*)(aclrtStream)>);

int main() {
    // A pointer to a virtual member holds its vtable byte offset (Itanium C++ ABI; ARM marks virtual
    // in the adjustment instead of the pointer). Expected slot: 2, after the two destructor entries.
    struct {
        std::uintptr_t ptr;
        std::ptrdiff_t adj;
    } pmf;
    auto member = &atb::Context::SetExecuteStream;
    static_assert(sizeof(member) == sizeof(pmf));
    std::memcpy(&pmf, &member, sizeof(pmf));
#if defined(__aarch64__) || defined(__arm__)
    const bool is_virtual = (pmf.adj & 1) != 0;
    const std::uintptr_t offset = pmf.ptr;
#else
    const bool is_virtual = (pmf.ptr & 1) != 0;
    const std::uintptr_t offset = pmf.ptr - 1;
#endif
    const std::uintptr_t expected = 2 * sizeof(void *);
    if (!is_virtual || offset != expected) {
        std::printf("compat_check: SetExecuteStream is at vtable byte offset %zu, harness expects %zu\n",
                    static_cast<std::size_t>(offset), static_cast<std::size_t>(expected));
        return 1;
    }
#ifdef MLA_COMPAT_ACLNN_STANDIN
    std::printf("compat_check: aclnn/acl_meta.h was a stand-in: aclCreateTensor/aclDestroyTensor NOT checked\n");
#endif
    std::printf("compat_check: native/src/atb_abi.h matches the installed ATB/CANN headers\n");
    return 0;
}
