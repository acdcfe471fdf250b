// pybind11 harness around ATB's MLA prefill C interface, loaded at run time with dlopen.
//
// Nothing from CANN is needed to build this file: the ABI slice lives in atb_abi.h. Every handle
// (library, context, aclTensor, operation) is owned by an RAII object, so each error path releases
// exactly what was created, once.
#include <dlfcn.h>
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "atb_abi.h"

namespace py = pybind11;

namespace {

// Raised when libatb or one of its symbols cannot be loaded.
class LoadError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// Raised when ATB returns a non-zero status; stage is "create", "setup" or "execute".
class StatusError : public std::runtime_error {
public:
    StatusError(std::string stage, mla_abi::Status status, const std::string &detail)
        : std::runtime_error(detail), stage_(std::move(stage)), status_(status) {}
    const std::string &stage() const { return stage_; }
    mla_abi::Status status() const { return status_; }

private:
    std::string stage_;
    mla_abi::Status status_;
};

std::string status_name(mla_abi::Status status) {
    if (status >= 0 && status < mla_abi::kStatusCount) {
        return mla_abi::kStatusNames[status];
    }
    return "UNKNOWN_STATUS_" + std::to_string(status);
}

std::string last_dl_error() {
    const char *err = dlerror();
    return err != nullptr ? err : "unknown dlerror";
}

struct DlCloser {
    void operator()(void *handle) const { dlclose(handle); }
};
using DlHandle = std::unique_ptr<void, DlCloser>;

// RTLD_NODELETE: libatb keeps its code mapped after dlclose, so its static destructors and any
// thread-local state never run against an unmapped image.
constexpr int kDlFlags = RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE;

struct Api {
    mla_abi::GetWorkspaceSizeFn get_workspace_size = nullptr;
    mla_abi::PreFillFn prefill = nullptr;
    mla_abi::AclCreateTensorFn create_tensor = nullptr;
    mla_abi::AclDestroyTensorFn destroy_tensor = nullptr;
    mla_abi::CreateContextFn create_context = nullptr;
    mla_abi::DestroyContextFn destroy_context = nullptr;
    mla_abi::DestroyOperationFn destroy_operation = nullptr;
};

template <class Fn>
Fn lookup(void *handle, const char *symbol) {
    return reinterpret_cast<Fn>(dlsym(handle, symbol));
}

// The candidate paths, in search order: MLA_ATB_LIB alone when set (an explicit choice must not
// silently fall back to another install), else $ATB_HOME_PATH/lib/libatb.so, then libatb.so.
std::vector<std::string> candidate_paths() {
    const char *explicit_path = std::getenv("MLA_ATB_LIB");
    if (explicit_path != nullptr && *explicit_path != '\0') {
        return {explicit_path};
    }
    std::vector<std::string> paths;
    const char *home = std::getenv("ATB_HOME_PATH");
    if (home != nullptr && *home != '\0') {
        paths.push_back(std::string(home) + "/lib/libatb.so");
    }
    paths.emplace_back("libatb.so");
    return paths;
}

class Library {
public:
    explicit Library(const std::optional<std::string> &path) {
        std::vector<std::string> paths = path ? std::vector<std::string>{*path} : candidate_paths();
        std::string tried;
        for (const std::string &candidate : paths) {
            handle_.reset(dlopen(candidate.c_str(), kDlFlags));
            if (handle_) {
                path_ = candidate;
                break;
            }
            tried += (tried.empty() ? " " : "; ") + candidate + " (" + last_dl_error() + ")";
        }
        if (!handle_) {
            throw LoadError("libatb not found; tried" + tried);
        }
        resolve();
    }

    const Api &api() const { return api_; }
    const std::string &path() const { return path_; }
    const std::string &acl_source() const { return acl_source_; }

private:
    void resolve() {
        void *h = handle_.get();
        api_.get_workspace_size = lookup<mla_abi::GetWorkspaceSizeFn>(h, mla_abi::kGetWorkspaceSizeSymbol);
        api_.prefill = lookup<mla_abi::PreFillFn>(h, mla_abi::kPreFillSymbol);
        if (api_.get_workspace_size == nullptr || api_.prefill == nullptr) {
            throw LoadError(path_ + " lacks " + mla_abi::kGetWorkspaceSizeSymbol + "/" + mla_abi::kPreFillSymbol +
                            ": the MLA prefill C interface needs CANN/NNAL >= 8.2.RC1");
        }
        api_.create_context = lookup<mla_abi::CreateContextFn>(h, mla_abi::kCreateContextSymbol);
        api_.destroy_context = lookup<mla_abi::DestroyContextFn>(h, mla_abi::kDestroyContextSymbol);
        api_.destroy_operation = lookup<mla_abi::DestroyOperationFn>(h, mla_abi::kDestroyOperationSymbol);
        if (api_.create_context == nullptr || api_.destroy_context == nullptr ||
            api_.destroy_operation == nullptr) {
            throw LoadError(path_ + " lacks atb::CreateContext/DestroyContext/DestroyOperation: not an ATB library");
        }
        resolve_acl();
    }

    // aclCreateTensor/aclDestroyTensor live in libnnopbase on a real install. Both are taken from the
    // same place, the first that has both: libatb and its dependencies, then everything already loaded
    // into the process (e.g. by torch_npu), then libnnopbase.so on the loader path.
    void resolve_acl() {
        if (take_acl(handle_.get())) {
            acl_source_ = path_;
            return;
        }
        if (take_acl(RTLD_DEFAULT)) {
            acl_source_ = "process";
            return;
        }
        nnopbase_.reset(dlopen("libnnopbase.so", kDlFlags));
        if (nnopbase_ && take_acl(nnopbase_.get())) {
            acl_source_ = "libnnopbase.so";
            return;
        }
        throw LoadError(std::string("aclCreateTensor/aclDestroyTensor not found in ") + path_ +
                        ", the process or libnnopbase.so: source CANN's set_env.sh");
    }

    bool take_acl(void *handle) {
        auto create = lookup<mla_abi::AclCreateTensorFn>(handle, mla_abi::kAclCreateTensorSymbol);
        auto destroy = lookup<mla_abi::AclDestroyTensorFn>(handle, mla_abi::kAclDestroyTensorSymbol);
        if (create == nullptr || destroy == nullptr) {
            return false;
        }
        api_.create_tensor = create;
        api_.destroy_tensor = destroy;
        return true;
    }

    DlHandle handle_;
    DlHandle nnopbase_;
    std::string path_;
    std::string acl_source_;
    Api api_;
};

// One atb::Context; keeps its library loaded for as long as it lives.
class Context {
public:
    explicit Context(std::shared_ptr<Library> library) : library_(std::move(library)) {
        mla_abi::Status status = library_->api().create_context(&context_);
        if (status != 0 || context_ == nullptr) {
            throw StatusError("create", status, "atb::CreateContext failed");
        }
    }
    ~Context() { library_->api().destroy_context(context_); }
    Context(const Context &) = delete;
    Context &operator=(const Context &) = delete;

    const Api &api() const { return library_->api(); }
    atb::Context *get() const { return context_; }

private:
    std::shared_ptr<Library> library_;
    atb::Context *context_ = nullptr;
};

struct TensorDeleter {
    mla_abi::AclDestroyTensorFn destroy;
    void operator()(aclTensor *tensor) const { destroy(tensor); }
};
using TensorPtr = std::unique_ptr<aclTensor, TensorDeleter>;

// Calls atb::DestroyOperation on whatever op GetWorkspaceSize left behind, success or not.
class OperationGuard {
public:
    explicit OperationGuard(mla_abi::DestroyOperationFn destroy) : destroy_(destroy) {}
    ~OperationGuard() {
        if (op_ != nullptr) {
            destroy_(op_);
        }
    }
    OperationGuard(const OperationGuard &) = delete;
    OperationGuard &operator=(const OperationGuard &) = delete;
    atb::Operation **slot() { return &op_; }
    atb::Operation *get() const { return op_; }
    // Gives up ownership: the operation is never destroyed (see keep_alive).
    void release() { op_ = nullptr; }

private:
    mla_abi::DestroyOperationFn destroy_;
    atb::Operation *op_ = nullptr;
};

// (name, data pointer, shape, aclDataType code, aclFormat code), as built by harness.atb.describe_tensors.
using TensorDesc = std::tuple<std::string, std::uintptr_t, std::vector<std::int64_t>, std::int32_t, std::int32_t>;
// (name, bytes, shape, aclDataType code, aclFormat code): a host tensor (qSeqLen, kvSeqLen) whose bytes
// the harness copies into a buffer it owns, as built by harness.atb.describe_host_tensors.
using HostTensorDesc = std::tuple<std::string, py::bytes, std::vector<std::int64_t>, std::int32_t, std::int32_t>;

TensorPtr make_tensor(const Api &api, const std::string &name, void *data, const std::vector<std::int64_t> &dims,
                      std::int32_t dtype, std::int32_t format) {
    std::vector<std::int64_t> strides(dims.size());
    std::int64_t stride = 1;
    for (std::size_t i = dims.size(); i-- > 0;) {
        if (dims[i] < 0) {
            throw py::value_error(name + " has a negative dimension");
        }
        strides[i] = stride;
        stride *= dims[i];
    }
    aclTensor *tensor = api.create_tensor(dims.data(), dims.size(), dtype, strides.data(), 0, format, dims.data(),
                                          dims.size(), data);
    if (tensor == nullptr) {
        throw std::runtime_error("aclCreateTensor returned null for " + name);
    }
    return TensorPtr(tensor, TensorDeleter{api.destroy_tensor});
}

// The C interface's tensor arguments; one that no descriptor names is passed as a null aclTensor*.
constexpr const char *kDeviceArgs[] = {"q", "q_rope", "k", "k_rope", "v", "mask", "out"};
constexpr const char *kHostArgs[] = {"q_seqlen", "kv_seqlen"};

// ATB's ERROR_INVALID_PARAM (include/atb/types.h).
constexpr mla_abi::Status kInvalidParam = 1;
static_assert(std::string_view(mla_abi::kStatusNames[kInvalidParam]) == "ERROR_INVALID_PARAM");

// After a synchronize that failed twice, device work may still read the operation, the tensors and the
// seqlen buffers: they are leaked on purpose, so nothing the device may touch is ever freed.
void keep_alive(std::map<std::string, std::vector<std::int64_t>> host_buffers, std::map<std::string, TensorPtr> tensors,
                OperationGuard &op) {
    for (auto &entry : tensors) {
        static_cast<void>(entry.second.release());
    }
    static_cast<void>(new std::map<std::string, std::vector<std::int64_t>>(std::move(host_buffers)));
    op.release();
}

template <std::size_t N>
bool known(const std::string &name, const char *const (&names)[N]) {
    for (const char *candidate : names) {
        if (name == candidate) {
            return true;
        }
    }
    return false;
}

std::uint64_t prefill(Context &context, const std::vector<TensorDesc> &tensors,
                      const std::vector<HostTensorDesc> &host_tensors, std::int32_t head_num, float qk_scale,
                      std::int32_t kv_head_num, int mask_type, int cache_mode, std::uintptr_t stream,
                      const std::function<std::uintptr_t(std::uint64_t)> &alloc_workspace,
                      const std::function<void()> &synchronize) {
    if (cache_mode < 0 || cache_mode > 255) {
        throw py::value_error("cacheMode must fit in uint8");
    }
    const Api &api = context.api();
    // Host buffers (qSeqLen, kvSeqLen): ATB reads them during GetWorkspaceSize and keeps the pointers;
    // owned by this frame (8-byte aligned) and declared before the tensors that point into them, so
    // they outlive both calls and the final synchronize.
    std::map<std::string, std::vector<std::int64_t>> host_buffers;
    std::map<std::string, TensorPtr> by_name;
    for (const auto &[name, ptr, shape, dtype, format] : tensors) {
        if (!known(name, kDeviceArgs)) {
            throw py::value_error("unknown tensor name: " + name);
        }
        if (by_name.count(name) != 0) {
            throw py::value_error("tensor given twice: " + name);
        }
        by_name.emplace(name, make_tensor(api, name, reinterpret_cast<void *>(ptr), shape, dtype, format));
    }
    for (const auto &[name, data, shape, dtype, format] : host_tensors) {
        if (!known(name, kHostArgs)) {
            throw py::value_error("unknown host tensor name: " + name);
        }
        if (by_name.count(name) != 0) {
            throw py::value_error("tensor given twice: " + name);
        }
        const std::string bytes = data;
        std::vector<std::int64_t> &buffer = host_buffers[name];
        buffer.assign((bytes.size() + sizeof(std::int64_t) - 1) / sizeof(std::int64_t), 0);
        std::copy(bytes.begin(), bytes.end(), reinterpret_cast<char *>(buffer.data()));
        by_name.emplace(name, make_tensor(api, name, buffer.data(), shape, dtype, format));
    }
    auto get = [&by_name](const char *name) -> aclTensor * {
        auto it = by_name.find(name);
        return it == by_name.end() ? nullptr : it->second.get();
    };

    atb::Context *ctx = context.get();
    mla_abi::Status status = ctx->SetExecuteStream(reinterpret_cast<mla_abi::Stream>(stream));
    if (status != 0) {
        throw StatusError("setup", status, "Context::SetExecuteStream failed");
    }

    OperationGuard op(api.destroy_operation);  // *op == nullptr: ATB creates a fresh operation
    std::uint64_t workspace_size = 0;
    {
        py::gil_scoped_release release;
        status = api.get_workspace_size(get("q"), get("q_rope"), get("k"), get("k_rope"), get("v"),
                                        get("q_seqlen"), get("kv_seqlen"), get("mask"), head_num, qk_scale,
                                        kv_head_num, mask_type, static_cast<std::uint8_t>(cache_mode), get("out"),
                                        &workspace_size, op.slot(), ctx);
    }
    if (status != 0) {
        // GetWorkspaceSize runs CreateOperation then Setup: no op yet means creation failed.
        const char *stage = op.get() == nullptr ? "create" : "setup";
        throw StatusError(stage, status, "AtbMLAPreFillGetWorkspaceSize failed");
    }
    void *workspace = workspace_size == 0 ? nullptr : reinterpret_cast<void *>(alloc_workspace(workspace_size));
    if (workspace == nullptr && workspace_size != 0) {
        // What ATB's OperationBase::ExecuteCheck returns for it; refused here, before any device work.
        throw StatusError("execute", kInvalidParam,
                          "alloc_workspace returned a null workspace for " + std::to_string(workspace_size) + " bytes");
    }
    {
        py::gil_scoped_release release;
        status = api.prefill(workspace, workspace_size, op.get(), ctx);
    }
    // The op, tensors and seqlen buffers stay alive until queued work has finished. If synchronize
    // raises, it is tried once more before anything is released; if that fails too, nothing is
    // released (a leak, never device work reading freed memory) and the first error propagates.
    try {
        synchronize();
    } catch (...) {
        try {
            synchronize();
        } catch (...) {
            keep_alive(std::move(host_buffers), std::move(by_name), op);
        }
        throw;
    }
    if (status != 0) {
        throw StatusError("execute", status, "AtbMLAPreFill failed");
    }
    return workspace_size;
}

}  // namespace

PYBIND11_MODULE(_atb_harness, m) {
    m.doc() = "dlopen-based harness around ATB's AtbMLAPreFillGetWorkspaceSize / AtbMLAPreFill";

    py::register_exception<LoadError>(m, "AtbLoadError", PyExc_OSError);
    // Stored once and never released: the type must outlive any exception raised at interpreter exit.
    PYBIND11_CONSTINIT static py::gil_safe_call_once_and_store<py::object> status_error;
    status_error.call_once_and_store_result(
        [&m]() { return py::exception<StatusError>(m, "AtbStatusError", PyExc_RuntimeError); });
    // AtbStatusError carries status, status_name, stage and detail as attributes.
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) {
                std::rethrow_exception(p);
            }
        } catch (const StatusError &e) {
            const py::object &type = status_error.get_stored();
            std::string name = status_name(e.status());
            py::object exc = type(name + " (" + std::to_string(e.status()) + ") at " + e.stage() + ": " + e.what());
            exc.attr("status") = e.status();
            exc.attr("status_name") = name;
            exc.attr("stage") = e.stage();
            exc.attr("detail") = std::string(e.what());
            py::set_error(type, exc);
        }
    });

    m.def("status_name", &status_name, py::arg("status"), "Symbolic name of an ATB status code.");
    m.attr("STATUS_COUNT") = mla_abi::kStatusCount;
    m.attr("ACL_FLOAT") = mla_abi::kAclFloat;
    m.attr("ACL_FLOAT16") = mla_abi::kAclFloat16;
    m.attr("ACL_INT32") = mla_abi::kAclInt32;
    m.attr("ACL_INT64") = mla_abi::kAclInt64;
    m.attr("ACL_BOOL") = mla_abi::kAclBool;
    m.attr("ACL_BF16") = mla_abi::kAclBf16;
    m.attr("ACL_FORMAT_NCHW") = mla_abi::kAclFormatNchw;
    m.attr("ACL_FORMAT_NHWC") = mla_abi::kAclFormatNhwc;
    m.attr("ACL_FORMAT_ND") = mla_abi::kAclFormatNd;
    m.attr("ACL_FORMAT_FRACTAL_NZ") = mla_abi::kAclFormatFractalNz;

    py::class_<Library, std::shared_ptr<Library>>(m, "Library")
        .def(py::init<const std::optional<std::string> &>(), py::arg("path") = py::none())
        .def_property_readonly("path", &Library::path)
        .def_property_readonly("acl_source", &Library::acl_source);

    py::class_<Context>(m, "Context")
        .def(py::init<std::shared_ptr<Library>>(), py::arg("library"));

    m.def("prefill", &prefill, py::arg("context"), py::arg("tensors"), py::arg("host_tensors"), py::arg("head_num"), py::arg("qk_scale"), py::arg("kv_head_num"), py::arg("mask_type"),
          py::arg("cache_mode"), py::arg("stream"), py::arg("alloc_workspace"), py::arg("synchronize"),
          "Run GetWorkspaceSize then AtbMLAPreFill with a fresh operation; returns the workspace size.\n"
          "A tensor argument that no descriptor names is passed as a null aclTensor*.");
}
