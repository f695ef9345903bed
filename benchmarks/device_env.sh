# Sourced by every device script (run_gpu.sh, firstcall.sh, tune_models.sh, zoo_models.sh):
# fastconv from this tree (SRC: another source tree, e.g.
# an older commit's src/ for a before/after run) and the carried wheels, unbuffered output.
# A script run without it found no fastconv on the device (python3 -m fastconv.tools.cli: "No
# module named 'fastconv'"; a device call lost so on 2026-11-25).
# The cuDNN frontend and timm are not installed on the device: carried wheels go to
# /tmp/site. Fetch them once (ignored by git) and name .whl in the device call's carry:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 -d .whl nvidia-cudnn-frontend==1.32.0
# and timm for the models suite's timm rows (pure Python; imports without its dependencies):
#   python3 -m pip download --no-deps --only-binary=:all: -d .whl timm
export PYTHONPATH=${SRC:-$PWD/src}:/tmp/site PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1 && [ ! -e /tmp/site/.carried ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && touch /tmp/site/.carried
fi
