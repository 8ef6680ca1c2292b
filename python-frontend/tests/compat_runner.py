"""Run `programs.compat_run` under one frontend and print its outputs as JSON.

Usage: ``python compat_runner.py URL MODULE`` with MODULE ``sglrs`` or ``sglang``. Both
frontends use the registry template ``chatml`` so their prompts are the same strings.
"""

from __future__ import annotations

import json
import os
import sys

if __name__ == "__main__":
    url, module = sys.argv[1], sys.argv[2]
    os.environ["SGL_MODULE"] = module
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import programs

    backend = programs.sgl.RuntimeEndpoint(url, chat_template_name="chatml")
    print(json.dumps(programs.compat_run(backend)))
