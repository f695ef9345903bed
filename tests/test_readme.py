"""The README's Python snippets run as pasted (on the CPU here; the same code picks the GPU
where there is one), and its two commands are the ones CI runs."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
SNIPPETS = re.findall(r"^```python\n(.*?)^```$", README.read_text(), re.S | re.M)


def test_the_readme_has_its_snippets_and_two_commands():
    assert len(SNIPPETS) >= 2
    commands = re.findall(r"^```bash\n(.*?)^```$", README.read_text(), re.S | re.M)
    assert len(commands) == 2  # .ci/run reads them from the README and runs both


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_readme_snippet_runs_as_pasted(index, tmp_path):
    pytest.importorskip("torchvision")
    script = tmp_path / f"snippet{index}.py"
    script.write_text(SNIPPETS[index])
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)
    assert done.returncode == 0, f"snippet {index}:\n{SNIPPETS[index]}\n{done.stderr[-3000:]}"
