// CPU test double of libatb for the harness tests: same exported symbols, no behaviour of ATB.
//
// It records every call (tensor descriptors with dtype and format codes, null arguments as null,
// scalars, stream, the int32 host seqlens as read), counts live aclTensors / operations / contexts,
// and returns a status injected per stage, so any ATB status at any stage can come back through the
// real extension. It validates nothing and computes nothing. The tests drive it through the extra extern "C" atb_double_* functions (ctypes).
//
// Build: g++ -std=c++17 -shared -fPIC -I native/src native/testing/libatb_double.cpp -o libatb_double.so
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "atb_abi.h"

struct aclTensor {
    std::vector<std::int64_t> dims;
    std::vector<std::int64_t> strides;
    std::vector<std::int64_t> storage_dims;
    std::int64_t offset;
    std::int32_t dtype;
    std::int32_t format;
    void *data;
};

namespace atb {
class Operation {
public:
    const std::int32_t *q_seqlen = nullptr;  // host pointers kept as ATB keeps its VariantPack
    const std::int32_t *kv_seqlen = nullptr;
    std::int64_t q_len = 0;
    std::int64_t kv_len = 0;
};
}  // namespace atb

namespace {

class FakeContext final : public atb::Context {
public:
    mla_abi::Status SetExecuteStream(mla_abi::Stream stream) override;
    mla_abi::Stream stream = nullptr;
};

std::string ptr_json(const void *p) { return std::to_string(reinterpret_cast<std::uintptr_t>(p)); }

template <class T>
std::string list_json(const std::vector<T> &values) {
    std::string out = "[";
    for (std::size_t i = 0; i < values.size(); ++i) {
        out += (i ? "," : "") + std::to_string(values[i]);
    }
    return out + "]";
}

struct State {
    std::mutex mutex;
    std::set<const aclTensor *> tensors;
    std::set<const atb::Operation *> operations;
    std::set<const atb::Context *> contexts;
    std::map<std::string, mla_abi::Status> injected;
    std::uint64_t workspace_size = 0;
    long create_tensor_calls = 0;
    long fail_tensor_at = -1;  // the aclCreateTensor call (by count) that returns null
    long tensors_created = 0;
    long tensors_destroyed = 0;
    long operations_created = 0;
    long bad_destroys = 0;  // destroy of an unknown or already destroyed handle
    std::vector<std::string> events;
    std::vector<std::string> workspace_calls;
    std::vector<std::string> execute_calls;
    std::vector<std::string> destroyed_operations;
    std::string json;

    mla_abi::Status injected_for(const std::string &stage) const {
        auto it = injected.find(stage);
        return it == injected.end() ? 0 : it->second;
    }
};

State &state() {
    static State s;
    return s;
}

mla_abi::Status FakeContext::SetExecuteStream(mla_abi::Stream s) {
    std::lock_guard<std::mutex> lock(state().mutex);
    state().events.push_back("set_stream");
    stream = s;
    return state().injected_for("stream");
}

std::string tensor_json(const aclTensor *t) {
    if (t == nullptr) {
        return "null";
    }
    std::ostringstream os;
    os << "{\"handle\":" << ptr_json(t) << ",\"data\":" << ptr_json(t->data) << ",\"dims\":" << list_json(t->dims)
       << ",\"strides\":" << list_json(t->strides) << ",\"storage_dims\":" << list_json(t->storage_dims)
       << ",\"offset\":" << t->offset << ",\"dtype\":" << t->dtype << ",\"format\":" << t->format
       << ",\"live\":" << (state().tensors.count(t) ? "true" : "false") << "}";
    return os.str();
}

// The host int32 values behind a tensor, read the way ATB reads qSeqLen/kvSeqLen (all elements).
std::vector<std::int32_t> read_host(const std::int32_t *data, std::int64_t n) {
    return data == nullptr ? std::vector<std::int32_t>{} : std::vector<std::int32_t>(data, data + n);
}

// Element count of an int32 tensor; 0 for null and for other dtypes, whose bytes are not read.
std::int64_t int32_count(const aclTensor *t) {
    if (t == nullptr || t->dtype != mla_abi::kAclInt32) {
        return 0;
    }
    std::int64_t n = 1;
    for (std::int64_t d : t->dims) {
        n *= d;
    }
    return n;
}

const std::int32_t *host_ints(const aclTensor *t) {
    return int32_count(t) == 0 ? nullptr : static_cast<const std::int32_t *>(t->data);
}

}  // namespace

extern "C" {

aclTensor *aclCreateTensor(const std::int64_t *viewDims, std::uint64_t viewDimsNum, std::int32_t dataType,
                           const std::int64_t *stride, std::int64_t offset, std::int32_t format,
                           const std::int64_t *storageDims, std::uint64_t storageDimsNum, void *tensorData) {
    State &s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    s.events.push_back("create_tensor");
    if (s.create_tensor_calls++ == s.fail_tensor_at) {
        return nullptr;
    }
    auto *t = new aclTensor{std::vector<std::int64_t>(viewDims, viewDims + viewDimsNum),
                            stride ? std::vector<std::int64_t>(stride, stride + viewDimsNum)
                                   : std::vector<std::int64_t>{},
                            std::vector<std::int64_t>(storageDims, storageDims + storageDimsNum),
                            offset, dataType, format, tensorData};
    s.tensors.insert(t);
    ++s.tensors_created;
    return t;
}

std::int32_t aclDestroyTensor(const aclTensor *tensor) {
    State &s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    s.events.push_back("destroy_tensor");
    if (s.tensors.erase(tensor) == 0) {
        ++s.bad_destroys;
        return 1;
    }
    ++s.tensors_destroyed;
    delete tensor;
    return 0;
}

mla_abi::Status AtbMLAPreFillGetWorkspaceSize(const aclTensor *q, const aclTensor *qRope, const aclTensor *k,
                                              const aclTensor *kRope, const aclTensor *v, const aclTensor *qSeqLen,
                                              const aclTensor *kvSeqLen, const aclTensor *mask, std::int32_t headNum,
                                              float qkScale, std::int32_t kvHeadNum, int maskType,
                                              std::uint8_t cacheMode, aclTensor *attenOut,
                                              std::uint64_t *workspaceSize, atb::Operation **op,
                                              atb::Context *context) {
    State &s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    s.events.push_back("get_workspace_size");
    const atb::Operation *op_in = op == nullptr ? nullptr : *op;
    auto *fake_context = static_cast<FakeContext *>(context);
    char scale[32];
    // JSON has no NaN/Inf: a non-finite qkScale is recorded as a string ("nan", "inf", "-inf").
    std::snprintf(scale, sizeof scale, std::isfinite(qkScale) ? "%.9g" : "\"%.9g\"", static_cast<double>(qkScale));
    std::ostringstream os;
    os << "{\"q\":" << tensor_json(q) << ",\"q_rope\":" << tensor_json(qRope) << ",\"k\":" << tensor_json(k)
       << ",\"k_rope\":" << tensor_json(kRope) << ",\"v\":" << tensor_json(v)
       << ",\"q_seqlen\":" << tensor_json(qSeqLen) << ",\"kv_seqlen\":" << tensor_json(kvSeqLen)
       << ",\"mask\":" << tensor_json(mask) << ",\"atten_out\":" << tensor_json(attenOut)
       << ",\"q_seqlen_read\":" << list_json(read_host(host_ints(qSeqLen), int32_count(qSeqLen)))
       << ",\"kv_seqlen_read\":" << list_json(read_host(host_ints(kvSeqLen), int32_count(kvSeqLen)))
       << ",\"head_num\":" << headNum << ",\"qk_scale\":" << scale << ",\"kv_head_num\":" << kvHeadNum
       << ",\"mask_type\":" << maskType << ",\"cache_mode\":" << static_cast<int>(cacheMode)
       << ",\"op_in\":" << ptr_json(op_in) << ",\"context\":" << ptr_json(context)
       << ",\"stream\":" << ptr_json(fake_context == nullptr ? nullptr : fake_context->stream);

    mla_abi::Status status = s.injected_for("create");
    if (status == 0 && op != nullptr && *op == nullptr) {
        auto *created = new atb::Operation{host_ints(qSeqLen), host_ints(kvSeqLen), int32_count(qSeqLen),
                                           int32_count(kvSeqLen)};
        s.operations.insert(created);
        ++s.operations_created;
        *op = created;
    }
    if (status == 0) {
        status = s.injected_for("setup");
    }
    if (status == 0 && workspaceSize != nullptr) {
        *workspaceSize = s.workspace_size;
    }
    os << ",\"op_out\":" << ptr_json(op == nullptr ? nullptr : *op) << ",\"status\":" << status << "}";
    s.workspace_calls.push_back(os.str());
    return status;
}

mla_abi::Status AtbMLAPreFill(void *workspace, std::uint64_t workspaceSize, atb::Operation *op,
                              atb::Context *context) {
    State &s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    s.events.push_back("prefill");
    bool live = s.operations.count(op) != 0;
    auto *fake_context = static_cast<FakeContext *>(context);
    std::ostringstream os;
    os << "{\"workspace\":" << ptr_json(workspace) << ",\"workspace_size\":" << workspaceSize
       << ",\"op\":" << ptr_json(op) << ",\"op_live\":" << (live ? "true" : "false")
       << ",\"context\":" << ptr_json(context)
       << ",\"stream\":" << ptr_json(fake_context == nullptr ? nullptr : fake_context->stream)
       << ",\"q_seqlen_read\":" << list_json(live ? read_host(op->q_seqlen, op->q_len) : std::vector<std::int32_t>{})
       << ",\"kv_seqlen_read\":"
       << list_json(live ? read_host(op->kv_seqlen, op->kv_len) : std::vector<std::int32_t>{})
       << ",\"live_tensors\":" << s.tensors.size() << "}";
    s.execute_calls.push_back(os.str());
    return s.injected_for("execute");
}

// Extra entry points for the tests.

void atb_double_reset() {
    State &s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    s.injected.clear();
    s.workspace_size = 0;
    s.create_tensor_calls = 0;
    s.fail_tensor_at = -1;
    s.tensors_created = s.tensors_destroyed = s.operations_created = s.bad_destroys = 0;
    s.events.clear();
    s.workspace_calls.clear();
    s.execute_calls.clear();
    s.destroyed_operations.clear();
}

// Forget the live aclTensors and operations without destroying them: what a test calls after the
// harness deliberately leaked them (a synchronize that kept failing), so later counts start from zero.
void atb_double_abandon_live() {
    std::lock_guard<std::mutex> lock(state().mutex);
    state().tensors.clear();
    state().operations.clear();
}

// stage: "context", "stream", "create", "setup" or "execute"; status 0 clears the injection.
void atb_double_inject(const char *stage, std::int32_t status) {
    std::lock_guard<std::mutex> lock(state().mutex);
    state().injected[stage] = status;
}

void atb_double_set_workspace_size(std::uint64_t size) {
    std::lock_guard<std::mutex> lock(state().mutex);
    state().workspace_size = size;
}

// Make the index-th aclCreateTensor call after now return null (once).
void atb_double_fail_create_tensor(long index) {
    std::lock_guard<std::mutex> lock(state().mutex);
    state().fail_tensor_at = state().create_tensor_calls + index;
}

// The record as JSON; valid until the next call.
const char *atb_double_record() {
    State &s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    auto join = [](const std::vector<std::string> &items, bool quote) {
        std::string out = "[";
        for (std::size_t i = 0; i < items.size(); ++i) {
            out += (i ? "," : "") + (quote ? "\"" + items[i] + "\"" : items[i]);
        }
        return out + "]";
    };
    std::ostringstream os;
    os << "{\"live\":{\"tensors\":" << s.tensors.size() << ",\"operations\":" << s.operations.size()
       << ",\"contexts\":" << s.contexts.size() << "},\"tensors_created\":" << s.tensors_created
       << ",\"tensors_destroyed\":" << s.tensors_destroyed << ",\"operations_created\":" << s.operations_created
       << ",\"bad_destroys\":" << s.bad_destroys << ",\"events\":" << join(s.events, true)
       << ",\"workspace_calls\":" << join(s.workspace_calls, false)
       << ",\"execute_calls\":" << join(s.execute_calls, false)
       << ",\"destroyed_operations\":" << join(s.destroyed_operations, false) << "}";
    s.json = os.str();
    return s.json.c_str();
}

}  // extern "C"

namespace atb {

mla_abi::Status CreateContext(Context **context) {
    State &s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    s.events.push_back("create_context");
    mla_abi::Status status = s.injected_for("context");
    if (status != 0) {
        return status;
    }
    auto *created = new FakeContext();
    s.contexts.insert(created);
    *context = created;
    return 0;
}

mla_abi::Status DestroyContext(Context *context) {
    State &s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    s.events.push_back("destroy_context");
    if (s.contexts.erase(context) == 0) {
        ++s.bad_destroys;
        return 1;
    }
    delete context;
    return 0;
}

mla_abi::Status DestroyOperation(Operation *operation) {
    State &s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    s.events.push_back("destroy_operation");
    if (s.operations.erase(operation) == 0) {
        ++s.bad_destroys;
        return 1;
    }
    s.destroyed_operations.push_back(ptr_json(operation));
    delete operation;
    return 0;
}

}  // namespace atb
