"""Train GPT-2 with minitorch on llm.c token shards (project/gpt2/main.py; also `python -m project.gpt2`).

    python project/train_gpt2.py --help
"""

import sys
from pathlib import Path

if __package__ in (None, ""):
    # Run as a script: make the repository root importable (minitorch, project).
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from project.gpt2.main import main

if __name__ == "__main__":
    main()
