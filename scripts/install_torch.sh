#!/bin/sh
# Install torch for a CPU-only Linux machine: `install_torch.sh PIP SPEC [pip options...]`.
#
# A plain `torch` from PyPI is the multi-GB CUDA build, so PyTorch's own CPU wheel index comes first
# (only that index: no find-links, no extra index). Where it cannot be reached (an offline mirror, a
# closed network) the attempt fails within seconds (5 s timeout, no retries) and pip installs SPEC
# through its own configuration instead, e.g. a local wheel of the pinned version.
set -u
pip_cmd=$1
shift
index="${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
if PIP_FIND_LINKS= PIP_EXTRA_INDEX_URL= $pip_cmd install -q --timeout 5 --retries 0 --index-url "$index" "$@" 2>/dev/null; then
  exit 0
fi
echo "PyTorch's CPU index ($index) could not be reached; installing $* through pip's own configuration." >&2
exec $pip_cmd install -q "$@"
