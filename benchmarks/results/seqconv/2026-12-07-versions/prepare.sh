# Run here (not on the device) before gpu_versions.sh: the kernel versions it compares, as
# untracked files in tmp_versions/ (carried with the working tree, copied into the package
# there). split: 05b2547's shortrows.py (the split loops, reverted in ba0acad).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
mkdir -p tmp_versions
git show 05b2547:src/fastconv/backends/triton/shortrows.py > tmp_versions/shortrows_split.py
ls tmp_versions
