"""`python -m project.gpt2`: the GPT-2 training program (main.py)."""

from project.gpt2.main import main

main()
