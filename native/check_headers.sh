#!/usr/bin/env bash
# Compile and run native/src/compat_check.cpp against a tree of ATB headers and a tree of CANN/ACL
# headers, without an Ascend install: the public repositories are enough (see native/README.md).
#
#   native/check_headers.sh ATB_INCLUDE CANN_INCLUDE [EXTRA_INCLUDE...]
#
#   ATB_INCLUDE    the directory holding atb/atb_acl.h (ascend-transformer-boost's include/)
#   CANN_INCLUDE   the directory holding acl/acl.h (torch_npu's third_party/acl/inc, or
#                  $ASCEND_HOME_PATH/include on an install)
#   EXTRA_INCLUDE  more include directories, searched in order; ATB's headers also need
#                  hccl/hccl_types.h (torch_npu's third_party/hccl/inc)
#
# aclnn/acl_meta.h and opdev/common_types.h ship only with CANN. When no given directory holds
# one, a stand-in written by this script takes its place: it declares the opaque aclnn types ATB's
# headers name (aclTensor, aclTensorList, aclIntArray, aclOpExecutor) and nothing else, and makes
# compat_check skip the aclCreateTensor/aclDestroyTensor checks (the run prints that it did).
# Nothing is written into the repository. Exit status: compat_check's, or 2 for bad arguments.
set -euo pipefail

if [[ $# -lt 2 ]]; then
    sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
includes=("$@")
for dir in "${includes[@]}"; do
    [[ -d "$dir" ]] || { echo "check_headers: not a directory: $dir" >&2; exit 2; }
done
[[ -f "$1/atb/atb_acl.h" ]] || { echo "check_headers: $1 has no atb/atb_acl.h" >&2; exit 2; }
[[ -f "$2/acl/acl.h" ]] || { echo "check_headers: $2 has no acl/acl.h" >&2; exit 2; }

found() {  # found HEADER: whether some given include directory holds HEADER
    local dir
    for dir in "${includes[@]}"; do
        [[ -f "$dir/$1" ]] && return 0
    done
    return 1
}

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
flags=()
if ! found aclnn/acl_meta.h; then
    echo "check_headers: aclnn/acl_meta.h not found: using a stand-in (aclCreateTensor/aclDestroyTensor unchecked)"
    mkdir -p "$work/standin/aclnn"
    cat >"$work/standin/aclnn/acl_meta.h" <<'EOF'
// Stand-in written by native/check_headers.sh: the opaque aclnn types ATB's public headers name.
#pragma once
#define MLA_COMPAT_ACLNN_STANDIN 1
typedef struct aclTensor aclTensor;
typedef struct aclTensorList aclTensorList;
typedef struct aclIntArray aclIntArray;
typedef struct aclOpExecutor aclOpExecutor;
EOF
    flags+=(-I"$work/standin")
fi
if ! found opdev/common_types.h; then
    echo "check_headers: opdev/common_types.h not found: using a stand-in that includes aclnn/acl_meta.h"
    mkdir -p "$work/standin/opdev"
    printf '#pragma once\n#include <aclnn/acl_meta.h>\n' >"$work/standin/opdev/common_types.h"
    flags+=(-I"$work/standin")
fi
if ! found hccl/hccl_types.h; then
    echo "check_headers: hccl/hccl_types.h not found (atb/infer_op_params.h includes it): pass" \
         "torch_npu's third_party/hccl/inc as an EXTRA_INCLUDE" >&2
    exit 2
fi

for dir in "${includes[@]}"; do
    flags+=(-I"$dir")
done
"${CXX:-g++}" -std=c++17 -Wall -Wextra "${flags[@]}" -I"$here/src" "$here/src/compat_check.cpp" \
    -o "$work/compat_check"
"$work/compat_check"
