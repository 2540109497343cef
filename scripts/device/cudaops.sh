#!/usr/bin/env bash
# scripts/device/cudaops.sh: helper cudaops's entry for the coordinator's combined device call
# (/tmp/k3-device-notice): the CUDA op harness checks and timings of cuda_ops_check.sh from .carry/cudaops,
# two logs in $OUT/cudaops/ (cuda_ops_test.log, cuda_ops_perf.log), at most ~140 s.
here=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp}/cudaops bash "$here/scripts/device/cuda_ops_check.sh" .carry/cudaops
