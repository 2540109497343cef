#!/usr/bin/env bash
# scripts/device/cudamodel.sh: helper cudamodel's entry for the coordinator's combined device call
# (/tmp/k3-device-notice): the GPU model checks of gpu_check.sh from .carry/cudamodel, logs in $OUT/cudamodel/.
here=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp}/cudamodel bash "$here/scripts/device/gpu_check.sh" .carry/cudamodel
