# the 16-position backward against the 8-position one on a GPU (probe_pairs.py)
source benchmarks/device_env.sh
python3 -c "import torch, triton; print(torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(), 'cudnn', torch.backends.cudnn.version())" > $OUT/env.log 2>&1
timeout 230 python3 probe_pairs.py > $OUT/probe-pairs.log 2>&1; echo "probe rc $?"
grep -E "^[a-z]|us \(|BEST" $OUT/probe-pairs.log | cut -c1-140
