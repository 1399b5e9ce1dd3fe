"""Training the engine's default pair (issue 11): corpus and tokenizer (``corpus``), target and drafter
(``train``). ``scripts/train_pair.py`` runs everything from one command."""
