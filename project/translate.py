"""Translate German sentences into English with a model trained by project/run_machine_translation.py
(project/translation/translate.py; also `python -m project.translation.translate`).

    python project/translate.py --checkpoint runs/mt "Ein Mann fährt Fahrrad."
"""

import sys
from pathlib import Path

if __package__ in (None, ""):
    # Run as a script: make the repository root importable (minitorch, project).
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from project.translation.translate import main

if __name__ == "__main__":
    main()
