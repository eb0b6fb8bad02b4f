"""The programs built on minitorch: common/ (what any training program needs), translation/
(German->English on Multi30k) and gpt2/ (GPT-2 on llm.c's file formats). No program imports
another, and common/ imports neither; all of them use only minitorch's public modules."""
