// CPU stand-in for the slice of CANN's runtime (libascendcl) the ATB repro calls: "device" memory is host
// memory, a stream is a token.  Linked with libatb_double.so, it lets tests build and run repro.cpp here.
// When MLA_ATB_DOUBLE_RECORD names a file, aclFinalize writes the libatb double's call record to it; when
// MLA_ACL_DOUBLE_ANSWER names one, a device-to-host copy of its size returns its bytes (a kernel's answer).
#include <acl/acl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

extern "C" const char *atb_double_record();

namespace {
int stream_token = 0;
}

extern "C" {
aclError aclInit(const char *) { return 0; }
aclError aclrtSetDevice(int32_t) { return 0; }
aclError aclrtResetDevice(int32_t) { return 0; }
aclError aclrtCreateStream(aclrtStream *stream) {
    *stream = &stream_token;
    return 0;
}
aclError aclrtDestroyStream(aclrtStream) { return 0; }
aclError aclrtSynchronizeStream(aclrtStream) { return 0; }
aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy) {
    *devPtr = std::malloc(size);
    return *devPtr == nullptr ? 1 : 0;
}
aclError aclrtFree(void *devPtr) {
    std::free(devPtr);
    return 0;
}
aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind) {
    if (count > destMax) return 1;
    const char *answer = std::getenv("MLA_ACL_DOUBLE_ANSWER");
    if (kind == ACL_MEMCPY_DEVICE_TO_HOST && answer != nullptr) {
        std::FILE *f = std::fopen(answer, "rb");
        if (f == nullptr) return 1;
        const size_t got = std::fread(dst, 1, count, f);
        std::fclose(f);
        return got == count ? 0 : 1;
    }
    std::memcpy(dst, src, count);
    return 0;
}
aclError aclFinalize() {
    const char *path = std::getenv("MLA_ATB_DOUBLE_RECORD");
    if (path != nullptr) {
        std::FILE *f = std::fopen(path, "w");
        if (f == nullptr) return 1;
        std::fputs(atb_double_record(), f);
        std::fclose(f);
    }
    return 0;
}
}
