#!/usr/bin/env bash
# The tests while the machine is loaded: the gtests STRESS_GTEST_REPEAT times
# over and the Python suite STRESS_PY_RUNS times, each beside `stress-ng --cpu
# <cores>`, the load under which tests that lean on timing fail. Goes on after
# a failure and ends with one line per run; exits non-zero if any failed.
# Run by `make test-stress`, which builds first.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:?BUILD_DIR is the build tree (make test-stress sets it)}
python=${PYTHON:-python3}
repeat=${STRESS_GTEST_REPEAT:-20}
runs=${STRESS_PY_RUNS:-5}
export TCE_SERVER_BIN=${TCE_SERVER_BIN:-$PWD/$build/server_cpp/tce-server}

stress-ng --cpu "$(nproc)" --timeout 0 --quiet &
load=$!
trap 'kill "$load" 2>/dev/null; wait "$load" 2>/dev/null' EXIT

summary=()
failed=0
for gtests in tce_server_tests tce_transport_factory_nofabric_tests; do
  start=$SECONDS
  if "$build/server_cpp/$gtests" --gtest_repeat="$repeat" --gtest_brief=1; then
    summary+=("$gtests x$repeat: passed ($((SECONDS - start)) s)")
  else
    summary+=("$gtests x$repeat: FAILED ($((SECONDS - start)) s)")
    failed=1
  fi
done
for i in $(seq "$runs"); do
  start=$SECONDS
  if "$python" -m pytest -q -p no:cacheprovider tests; then
    summary+=("pytest run $i of $runs: passed ($((SECONDS - start)) s)")
  else
    summary+=("pytest run $i of $runs: FAILED ($((SECONDS - start)) s)")
    failed=1
  fi
done
printf '%s\n' "${summary[@]}"
exit "$failed"
