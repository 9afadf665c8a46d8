"""Text-to-SQL over a real SQLite database built from the HotpotQA files: an example sleuth plugin written
only against sleuth's public API."""
