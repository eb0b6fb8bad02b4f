"""`python -m project.translation`: the translation program (main.py)."""

from project.translation.main import main

main()
