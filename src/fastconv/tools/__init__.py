"""fastconv's tools: the command line (``cli``), the demo, tuning, the numerical check and
its random cases (``testing``), the benchmark harness (``bench``) and progress bars. They
use the library; nothing in the library imports them (tests/test_layering.py)."""
