// Stand-in for ATB's include/atb/context.h (see acl/acl.h here): the Context view of native/src/atb_abi.h.
#pragma once
#include "atb_abi.h"

namespace atb {
using Status = mla_abi::Status;
Status CreateContext(Context **context);
Status DestroyContext(Context *context);
}  // namespace atb
