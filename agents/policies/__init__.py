"""Policies: the protocol (token ids in, ids and logprobs out) and its implementations, loaded by name."""
