// Stand-in for ATB's include/atb/atb_acl.h (see acl/acl.h here): the two MLA prefill entry points.
#pragma once
#include <aclnn/acl_meta.h>
#include <atb/operation.h>

extern "C" {
atb::Status AtbMLAPreFillGetWorkspaceSize(const aclTensor *q, const aclTensor *qRope, const aclTensor *k,
                                          const aclTensor *kRope, const aclTensor *v, const aclTensor *qSeqLen,
                                          const aclTensor *kvSeqLen, const aclTensor *mask, int32_t headNum,
                                          float qkScale, int32_t kvHeadNum, int maskType, uint8_t cacheMode,
                                          aclTensor *attenOut, uint64_t *workspaceSize, atb::Operation **op,
                                          atb::Context *context);
atb::Status AtbMLAPreFill(void *workspace, uint64_t workspaceSize, atb::Operation *op, atb::Context *context);
}
