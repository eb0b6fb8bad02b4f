"""Turn a text file into llm.c token shards for GPT-2 training (project/gpt2/data.py; also
`python -m project.gpt2.data`).

    python project/gpt2_data.py --out-dir runs/gpt2_data
"""

import sys
from pathlib import Path

if __package__ in (None, ""):
    # Run as a script: make the repository root importable (minitorch, project).
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from project.gpt2.data import main

if __name__ == "__main__":
    main()
