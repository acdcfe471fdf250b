// Stand-in for ATB's include/atb/operation.h (see acl/acl.h here).
#pragma once
#include <atb/context.h>

namespace atb {
Status DestroyOperation(Operation *operation);
}  // namespace atb
