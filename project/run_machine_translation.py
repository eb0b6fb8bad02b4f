"""Train minitorch's DecoderLM to translate German to English on Multi30k (the translation program:
project/translation/main.py; also `python -m project.translation`).

    python project/run_machine_translation.py --preset tiny
"""

import sys
from pathlib import Path

if __package__ in (None, ""):
    # Run as a script: make the repository root importable (minitorch, project).
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from project.translation.main import main

if __name__ == "__main__":
    main()
