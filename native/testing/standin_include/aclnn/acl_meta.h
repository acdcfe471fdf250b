// Stand-in for CANN's aclnn/acl_meta.h (see acl/acl.h here): aclTensor and its two functions.
#pragma once
#include <acl/acl.h>

typedef struct aclTensor aclTensor;

extern "C" {
aclTensor *aclCreateTensor(const int64_t *viewDims, uint64_t viewDimsNum, aclDataType dataType, const int64_t *stride,
                           int64_t offset, aclFormat format, const int64_t *storageDims, uint64_t storageDimsNum,
                           void *tensorData);
int aclDestroyTensor(const aclTensor *tensor);
}
